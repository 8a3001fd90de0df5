"""Reports over finished runs: tables, survival plot, per-genre tables, HTML
transcripts (`mode=report`), and the human review sheet (`mode=review`).

Reads run directories only; never writes into a run's own files (the report
goes to `<first run>/report/` or `report.out`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..config import ConfigError
from .html import write_html
from .plots import inline_svg, write_survival
from .review import disputed_summary, export_sheet, read_sheet, summary_csv, summary_markdown
from .runs import Run, attach_specs, is_sweep_folder, load_runs
from .tables import (
    genre_csv, genre_markdown, summary_csv as results_csv, summary_markdown as results_markdown, summary_rows,
    survival_csv, write,
)

__all__ = ["report_main", "review_main", "build_report", "load_runs", "Run"]


def _runs(cfg: Any) -> list[Run]:
    if not cfg.runs:
        raise ConfigError("runs", "give at least one run directory: runs=[DIR,...]")
    runs = load_runs(list(cfg.runs), cfg.report.label)
    for run in runs:
        attach_specs(run, cfg.report.dataset)
    return runs


def build_report(runs: list[Run], out: Path, resamples: int = 2000, seed: int = 0, level: float = 0.95,
                 html: bool = True) -> dict[str, Any]:
    """Write every report file into `out`; returns the tables' text and the paths written."""
    rows = summary_rows(runs, resamples, seed, level)
    summary_md = results_markdown(rows, level)
    genres_md = genre_markdown(runs)
    notes = [f"- {r.label}: {n}" for r in runs for n in r.notes]
    doc = "# NCP results\n\n" + summary_md + "\n\n## Per genre\n\n" + genres_md + "\n"
    if notes:
        doc += "\n## Notes\n\n" + "\n".join(notes) + "\n"
    files = [
        write(out / "results.md", doc),
        write(out / "results.csv", results_csv(rows)),
        write(out / "genres.md", "# NCP results per genre\n\n" + genres_md + "\n"),
        write(out / "genres.csv", genre_csv(runs)),
        write(out / "survival.csv", survival_csv(runs, level)),
    ]
    png, svg = write_survival(runs, out, level)
    files += [png, svg]
    if html:
        files.append(write_html(runs, rows, out, inline_svg(svg), level))
    return {"rows": rows, "summary_md": summary_md, "genres_md": genres_md, "notes": notes, "files": files}


def _default_out(cfg: Any, runs: list[Run], name: str) -> Path:
    """`<sweep folder>/<name>` for one sweep folder, else `<first run>/<name>`."""
    given = [Path(r).expanduser() for r in cfg.runs]
    if len(given) == 1 and is_sweep_folder(given[0]):
        return given[0] / name
    return runs[0].path / name


def report_main(cfg: Any) -> int:
    runs = _runs(cfg)
    out = Path(cfg.report.out).expanduser() if cfg.report.out else _default_out(cfg, runs, "report")
    rep = build_report(runs, out, cfg.report.resamples, cfg.report.seed, cfg.report.level, cfg.report.html)
    print(rep["summary_md"])
    for note in rep["notes"]:
        print(note)
    print(f"report: {out} (results.md/.csv, genres.md/.csv, survival.png/.svg/.csv"
          + (", index.html" if cfg.report.html else "") + ")")
    return 0


def review_main(cfg: Any) -> int:
    rc = cfg.review
    if rc.sheet:
        sheet = Path(rc.sheet).expanduser()
        summary = disputed_summary(read_sheet(sheet))
        md = summary_markdown(summary)
        write(sheet.with_name(sheet.stem + "_summary.md"), "# Human review: disputed conflicts\n\n" + md + "\n")
        write(sheet.with_name(sheet.stem + "_summary.csv"), summary_csv(summary))
        print(md)
        print(f"summary: {sheet.with_name(sheet.stem + '_summary.md')}")
        return 0
    runs = _runs(cfg)
    out = Path(rc.out).expanduser() if rc.out else _default_out(cfg, runs, "review")
    csv_path, html_path, n = export_sheet(runs, out, rc.n, rc.seed)
    pool = sum(r.termination == "conflict" for run in runs for r in run.results.values())
    print(f"review sheet: {n} conflict(s) from {min(rc.n, pool)} of {pool} conflict terminations "
          f"(seed {rc.seed})\n  {csv_path}\n  {html_path}\n"
          f"fill in the verdict column (agree/dispute), then: python run.py mode=review review.sheet={csv_path}")
    return 0
