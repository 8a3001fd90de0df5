"""The NCP protocol (PROTOCOL.md): specs, the ledger, stages, prompts, episodes, narrator
methods and player conditions, metrics and the re-audit's records.

Knows no engine, no config object and no run directory: model calls arrive
through an `Ask`, settings as plain values.
"""

# The role slots of an episode; each names the model that answers its stages.
ROLES: tuple[str, ...] = ("narrator", "player", "auditor")
