"""`mode=compare runs=[BASELINE,RUN,...]`: each run's difference from the first, paired by story, and the
paper's figures beside each run (report/compare_doc.py)."""

from __future__ import annotations

from pathlib import Path

from ..config import ConfigError, RunConfig
from ..report import default_out
from ..report.brief import compare_brief
from ..report.compare_doc import compare_document
from ..report.paper import row_named
from ..report.reaudit_runs import load_compared
from ..report.runs import attach_specs
from ..rundir.atomic import atomic_write
from ..rundir.layout import require_finished
from ..rundir.places import check_destination

ONE_RUN = "give two runs or more to compare, the first the baseline (runs=[A,B,...]), or one with compare.paper=<row>"


def main(cfg: RunConfig) -> int:
    if cfg.compare.paper:
        row_named(cfg.compare.paper)  # an unknown row is refused before any run is read
    elif len(cfg.runs) < 2:
        raise ConfigError("runs", ONE_RUN)
    require_finished(cfg.runs)
    runs = load_compared(list(cfg.runs), cfg.report.label)  # re-audit directories too: auditors compared
    for run in runs:
        attach_specs(run, cfg.report.dataset)
    if len(runs) < 2 and not cfg.compare.paper:  # a sweep folder or a glob that held one run
        raise ConfigError("runs", ONE_RUN)
    rep = cfg.report
    doc = compare_document(runs, cfg.compare.paper, rep.horizon, rep.resamples, rep.seed, rep.level)
    if doc.comparisons is not None and not doc.comparisons.compared and not doc.paper:
        raise ConfigError("runs", "; ".join(doc.comparisons.refused) + ": nothing to compare")
    out = Path(rep.out).expanduser() if rep.out else default_out(cfg, runs, "compare")
    check_destination(out, "report.out")
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "compare.md", "# Comparisons\n\n" + doc.text + "\n")
    written = ["compare.md"]
    if doc.csv is not None:
        atomic_write(out / "compare.csv", doc.csv)
        written.append("compare.csv")
    if not doc.text:
        print("no paper row matches these runs' narrator, method and input (compare.paper=<row> picks one)")
    print(compare_brief(doc, rep.level, [f"compare: {out} ({', '.join(written)})"]))
    return 0
