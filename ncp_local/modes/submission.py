"""`mode=submission`: finished runs packed into one archive anyone can verify (report/submission.py):
`runs=[DIR,...]`, written to `submission=FILE` (default `<first run>/submission.tar.gz`). Its flags
(`official_prompts`, `official_dataset`, `complete`, `verified`) are computed from the runs' records.
(Named `submission`, not `submit`: `slurm/submit.py` is the Slurm submitter.)"""

from __future__ import annotations

from pathlib import Path

from ..config import RunConfig
from ..errors import InputError
from ..report import runs_of
from ..report.submission import build, validate
from ..rundir.atomic import atomic_write
from ..rundir.layout import require_finished
from ..rundir.places import check_destination

ARCHIVE = "submission.tar.gz"


def main(cfg: RunConfig) -> int:
    require_finished(cfg.runs)
    runs = runs_of(cfg)
    out = Path(cfg.submission).expanduser() if cfg.submission else runs[0].path / ARCHIVE
    if out.is_dir():
        raise InputError(out, "submission", "is a directory; give the archive's file name (e.g. sub.tar.gz)")
    data = build(runs, cfg.report.resamples, cfg.report.seed, cfg.report.level)  # everything checks before a write
    check_destination(out.parent, "submission")
    atomic_write(out, data)
    sub = validate(out)  # what a reader will run, run once here
    for entry in sub.runs:
        flags = ", ".join(f"{k}={'true' if v else 'false'}" for k, v in entry.flags.model_dump().items())
        print(f"{entry.label}: {len(entry.results)} result(s); {flags}")
    for line in sub.why_not:
        print(f"  not verified: {line}")
    print(f"verified: {'true' if sub.flags.verified else 'false'}")
    print(f"submission: {out} (anyone checks it: python run.py mode=validate submission={out})")
    return 0
