"""`mode=review`: a human review sheet of conflict terminations; `review.sheet=CSV` reads it back."""

from __future__ import annotations

from pathlib import Path

from ..config import RunConfig
from ..report import default_out, run_notes, runs_of
from ..report.review import disputed_summary, export_sheet, read_sheet, summary_csv, summary_markdown
from ..report.tables import write
from ..rundir.layout import require_finished
from ..rundir.places import check_destination


def main(cfg: RunConfig) -> int:
    rc = cfg.review
    if not rc.sheet:
        require_finished(cfg.runs)
    if rc.sheet:
        sheet = Path(rc.sheet).expanduser()
        summary = disputed_summary(read_sheet(sheet))
        check_destination(sheet.parent, "review.sheet")  # its summaries go beside it
        md = summary_markdown(summary)
        write(sheet.with_name(sheet.stem + "_summary.md"), "# Human review: disputed conflicts\n\n" + md + "\n")
        write(sheet.with_name(sheet.stem + "_summary.csv"), summary_csv(summary))
        print(md)
        print(f"summary: {sheet.with_name(sheet.stem + '_summary.md')}")
        return 0
    runs = runs_of(cfg)
    out = Path(rc.out).expanduser() if rc.out else default_out(cfg, runs, "review")
    check_destination(out, "review.out")
    csv_path, html_path, n = export_sheet(runs, out, rc.n, rc.seed)
    for line in run_notes(runs):  # a damaged or unfinished episode is not sampled: say so
        print(f"note: {line}")
    pool = sum(r.termination == "conflict" for run in runs for r in run.results.values())
    print(
        f"review sheet: {n} conflict(s) from {min(rc.n, pool)} of {pool} conflict terminations "
        f"(seed {rc.seed})\n  {csv_path}\n  {html_path}\n"
        f"fill in the verdict column (agree/dispute), then: python run.py mode=review review.sheet={csv_path}"
    )
    return 0
