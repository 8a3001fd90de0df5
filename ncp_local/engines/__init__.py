"""Model engines behind one interface (`base.Engine`: `generate(request)`, `close()`): in-process
vLLM, an OpenAI-compatible endpoint, scripted answers, the embedded model, grammar adaptation
per structured-output backend, and the engine watchdog.

Knows no protocol, no config object and no run directory: an engine takes plain settings
(`settings.ModelSettings`) and requests carrying opaque tags.
"""
