"""`mode=validate submission=FILE`: check a submission archive from its contents alone (report/submission.py):
seals, hashes, and every metric, interval, S(t) and flag recomputed from the sealed results. The first
difference is one `error:` line naming the archive member and the field (exit 2)."""

from __future__ import annotations

from ..config import ConfigError, RunConfig
from ..report.submission import validate


def main(cfg: RunConfig) -> int:
    if not cfg.submission:
        raise ConfigError("submission", "give the archive to check: submission=FILE")
    sub = validate(cfg.submission)
    for entry in sub.runs:
        flags = ", ".join(f"{k}={'true' if v else 'false'}" for k, v in entry.flags.model_dump().items())
        print(f"{entry.label}: {len(entry.results)} sealed result(s) check; {flags}")
    for line in sub.why_not:
        print(f"  not verified: {line}")
    print(
        f"valid: every seal, hash, metric and flag of {cfg.submission} checks; verified: "
        f"{'true' if sub.flags.verified else 'false'}"
    )
    return 0
