"""The exit codes of every command, in one place (the docs' exit-code reference is generated from this file).

Constants only, importing nothing: run.py reads them before anything else loads (a Ctrl-C during
start-up still ends in its one line). Which failure ends in which code is `execution/failures.py`.
"""

EXIT_OK = 0
EXIT_FAILED = 1  # mode=build with failed specs, mode=plan overflow, sbatch failed, or a bug (with its traceback)
EXIT_BAD_INPUT = 2  # a config, override, spec, pack, model path, run directory or output path refused before it ran
EXIT_ENGINE_DEAD = 3  # an engine died or failed to start: the same command resumes
EXIT_DISK_FULL = 4  # disk full or quota while writing; every file written is whole
# The run failed systematically: a stage's first calls failed the same engine-side way in every
# episode tried (stopped early), or most finished episodes are invalid for one reason.
EXIT_SYSTEMATIC = 5
# A sweep (either launcher) ran every point it could and some failed (each said why).
EXIT_SWEEP_FAILED = 6
# The reader of the output closed it (`| head`): ended quietly, as a shell tool killed by SIGPIPE (128 + 13);
# every file the command had written is whole, a run's results among them.
EXIT_CLOSED_PIPE = 141
# 128 + signal number, as a shell reports it; Slurm requeues a preempted task.
EXIT_SIGNAL = {"SIGTERM": 143, "SIGINT": 130}
STOPPED_BY_SIGNAL = tuple(EXIT_SIGNAL.values())
# Ctrl-C outside a run's own handler (start-up, re-audit, reports): every result is written whole
# or not at all, so stopping loses nothing.
INTERRUPTED_LINE = "error: stopped by SIGINT; run the same command again to resume"
