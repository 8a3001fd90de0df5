"""The tests `make test-newest` runs again on the newest supported Python: those whose result can
depend on the interpreter's version, not the whole no-engine tier (running all of it again cost about
6 of `make test`'s 25 minutes on the slower machine kind, 2026-12-05). The statistics, the report's
rendering and the plan's arithmetic run once, on 3.11. Each entry is a test file or one test of it
(a node id under tests/), with what of Python it exercises; tests/test_imports.py checks that every
entry still names a test and imports every module of the package on each Python."""

from __future__ import annotations

NEWEST_PASS = {
    "test_imports.py": "every module's syntax and imports, and the typing they evaluate at import time",
    "test_wheel.py": "packaging: the wheel's build, its data files, the console scripts in a fresh venv",
    "test_lock.py": "the lock, the declared dependencies and Pythons",
    "test_bare_machine.py::test_default_run_without_the_engine_package": "a machine without vLLM or torch",
    "test_cli.py": "the entry points and their exit codes",
    "test_config.py": "Hydra, OmegaConf and pydantic on the config",
    "test_identity.py::test_settings_that_change_results_are_in_the_identity": "identity hashes",
    "test_identity.py::test_rerun_reproduces_a_finished_run_byte_for_byte": "the same bytes on every Python",
    "test_store.py": "atomic writes, umask, errno handling and the append-only records",
    "test_faults.py::test_sigterm_flushes_and_exit_status_resumes": "signals and asyncio's shutdown",
    "test_fail_fast.py": "asyncio cancellation on the first systematic failure",
    "test_episode.py": "the protocol's episode loop (asyncio)",
    "test_modes.py": "every mode end to end on the scripted engine",
    "test_inspect_export.py": "inspect_ai's log types",
    "test_slurm_serve.py": "argparse in the submitter and the server job's command lines",
}


def in_newest_pass(nodeid: str) -> bool:
    """Whether a test (its pytest node id, `tests/test_x.py::test_y[param]`) is in the newest pass."""
    rel = nodeid.removeprefix("tests/")
    return any(rel == entry or rel.startswith((f"{entry}::", f"{entry}[")) for entry in NEWEST_PASS)
