"""Running the protocol: the call service (retries, seeds, call log) and the episode scheduler,
the one pre-flight check, the run directory (layout, store, identity, provenance), the engine
pool, progress, merge, the sweep index and the exit codes.

May import protocol, engines, config and plan; never a report or a mode.
"""
