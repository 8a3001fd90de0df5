"""`mode=report`'s report: every table, plot and page of a set of runs written into one folder, and the
notes a reader of those runs must see."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..config import ConfigError, RunConfig
from .brief import verdicts
from .compare_doc import compare_document
from .cost import Planner, cost_markdown, cost_rows_csv, cost_table
from .endings import endings_csv, endings_markdown, run_endings
from .failure_modes import modes_csv, modes_markdown, run_modes
from .html import write_html
from .misses import misses_section
from .mpl_home import ready as plots_ready
from .plant_dirs import PlantDir
from .precision import auditor_error, auditor_error_markdown, corrected_survival_csv
from .ran import ran_lines
from .runs import Run, attach_specs, is_sweep_folder, load_runs
from .tables import (
    csv_text,
    genre_csv,
    genre_markdown,
    summary_rows,
    survival_csv,
    write,
)
from .tables import (
    summary_csv as results_csv,
)
from .tables import (
    summary_markdown as results_markdown,
)
from .trials import run_trials
from .trials_doc import noise_csv, passk_csv, stories_csv, stories_markdown, trials_markdown


def runs_of(cfg: RunConfig) -> list[Run]:
    if not cfg.runs:
        raise ConfigError("runs", "give at least one run directory: runs=[DIR,...]")
    runs = load_runs(list(cfg.runs), cfg.report.label)
    for run in runs:
        attach_specs(run, cfg.report.dataset)
    return runs


def build_report(
    runs: list[Run],
    out: Path,
    resamples: int = 2000,
    seed: int = 0,
    level: float = 0.95,
    html: bool = True,
    gpu_hour_cost: float | None = None,
    plan: Planner | None = None,
    dataset: str | None = None,
    review_sheet: str | Path | None = None,
    horizon: int | None = None,
    paper_row: str | None = None,
    plants: Sequence[PlantDir] = (),
) -> dict[str, Any]:
    """Write every report file into `out`; returns the tables' text and the paths written.

    A review sheet is read and checked against the runs first, so a bad one writes nothing."""
    for run in runs:
        run.bootstrap = (resamples, seed)
    err = auditor_error(review_sheet, runs, resamples, seed, level) if review_sheet else None
    rows = summary_rows(runs, resamples, seed, level, horizon)
    summary_md = results_markdown(rows, level)
    genres_md = genre_markdown(runs)
    costs = [cost_table(r, gpu_hour_cost, plan, dataset) for r in runs]
    cost_md = cost_markdown(costs)
    ends = run_endings(runs, level)
    endings_md = endings_markdown(ends)
    modes = [run_modes(r) for r in runs]
    modes_md = modes_markdown(modes)
    auditor_md = auditor_error_markdown(err, level)
    rts = run_trials(runs, level)  # only runs that played their stories more than once
    trials_md = trials_markdown(rts, level) if rts else ""
    misses_md, misses_notes = misses_section(runs, plants, resamples, seed, level)
    notes = [f"- {line}" for line in (*run_notes(runs), *misses_notes)]
    # Runs that share stories are compared with the first; the paper's figures beside a run that matches a row.
    cmp = (
        compare_document(runs, paper_row, horizon, resamples, seed, level, listed=True)
        if len(runs) > 1 or paper_row
        else None
    )
    shown = cmp is not None and (bool(cmp.comparisons and cmp.comparisons.compared) or bool(cmp.paper))
    compare_md = cmp.text if cmp is not None and shown else ""
    ran = what_ran_markdown(runs)
    said = verdicts(cmp.comparisons) if cmp is not None and shown else None
    doc = (
        "# NCP results\n\n"
        + ran
        + summary_md
        + ("\n\n## Verdicts against the baseline\n\n" + "\n".join(said.lines) if said else "")
        + "\n\n## What ended each story\n\n"
        + endings_md
        + ("\n\n" + compare_md if compare_md else "")  # the answer first: each figure with its test after it
        + "\n\n## Failure modes\n\n"
        + modes_md
        + ("\n\n## Trials: pass^k and the noise floor\n\n" + trials_md if rts else "")
        + "\n\n## The auditor's error\n\n"
        + auditor_md
        + ("\n\n## The auditor's misses\n\n" + misses_md if misses_md else "")
        + "\n\n## Per genre\n\n"
        + genres_md
        + "\n\n## Cost by role and stage\n\n"
        + cost_md
        + "\n"
    )
    if notes:
        doc += "\n## Notes\n\n" + "\n".join(notes) + "\n"
    files = [
        write(out / "results.md", doc),
        write(out / "results.csv", results_csv(rows)),
        write(out / "genres.md", "# NCP results per genre\n\n" + ran + genres_md + "\n"),
        write(out / "genres.csv", genre_csv(runs)),
        write(out / "survival.csv", survival_csv(runs, level)),
        write(out / "endings.csv", endings_csv(ends)),
        write(out / "failure_modes.csv", modes_csv(modes)),
        write(out / "cost.csv", csv_text(*cost_rows_csv(costs))),
    ]
    if err is not None:
        files.append(write(out / "survival_corrected.csv", corrected_survival_csv(err)))
    if cmp is not None and shown and cmp.csv is not None:
        files.append(write(out / "compare.csv", cmp.csv))
    corrected = {c.label: c.survival[1] for c in err.corrected} if err is not None else {}
    # The plots import matplotlib only now (mpl_home: it needs a folder it can write); without one the
    # report is written without its plots, and says so in one line.
    no_plots = plots_ready(out)
    if no_plots:
        print(f"warning: {out}: plots skipped ({no_plots}); set MPLCONFIGDIR to a writable folder", file=sys.stderr)
        svg_text = ends_text = passk_text = ""
    else:
        # After plots_ready(): importing matplotlib writes its config folder.
        from .plots import inline_svg, write_endings, write_passk, write_survival

        png, svg = write_survival(runs, out, level, corrected)
        ends_png, ends_svg = write_endings([(e.label, e.incidence, e.survival) for e in ends], out)
        files += [png, svg, ends_png, ends_svg]
        svg_text, ends_text = inline_svg(svg), inline_svg(ends_svg)
        passk_text = ""
        if rts:
            passk_png, passk_svg = write_passk(rts, out)
            files += [passk_png, passk_svg]
            passk_text = inline_svg(passk_svg)
    if rts:
        files += [
            write(
                out / "trials.md",
                "# Trials\n\n" + ran + trials_md + "\n\n## Per story\n\n" + stories_markdown(rts) + "\n",
            ),
            write(out / "passk.csv", passk_csv(rts)),
            write(out / "noise.csv", noise_csv(rts)),
            write(out / "stories.csv", stories_csv(rts)),
        ]
    if html:
        files.append(
            write_html(
                runs,
                rows,
                out,
                svg_text,
                level,
                costs,
                endings=(ends, ends_text),
                auditor=err,
                modes=modes,
                trials=(rts, passk_text) if rts else None,
                comparisons=cmp.comparisons if cmp is not None and shown else None,
            )
        )
    return {
        "rows": rows,
        "ran_md": ran,
        "summary_md": summary_md,
        "compare_md": compare_md,
        "comparisons": cmp.comparisons if cmp is not None and shown else None,
        "paper": cmp.paper if cmp is not None else [],
        "endings_md": endings_md,
        "endings": ends,
        "modes_md": modes_md,
        "modes": modes,
        "trials_md": trials_md,
        "trials": rts,
        "auditor_md": auditor_md,
        "auditor_error": err,
        "misses_md": misses_md,
        "genres_md": genres_md,
        "cost_md": cost_md,
        "costs": costs,
        "notes": notes,
        "files": files,
    }


def files_listing(out: Path, files: Sequence[Path]) -> str:
    """The files written into `out`, as a closing line lists them: `results.md/.csv, cost.csv, ...`
    (one stem's files together, in the order written). Only files that are there: a skipped plot or
    an HTML page not asked for is not named."""
    by_stem: dict[str, list[str]] = {}
    for path in files:
        if not path.is_file():
            continue
        rel = path.relative_to(out) if path.is_relative_to(out) else path
        stem = str(rel.with_suffix(""))
        by_stem.setdefault(stem, []).append(rel.suffix)
    return ", ".join(f"{stem}{'/'.join(suffixes)}" for stem, suffixes in by_stem.items())


def what_ran_markdown(runs: list[Run]) -> str:
    """What ran (report/ran.py), the lines each Markdown page starts with."""
    per_run, rest = ran_lines(runs)
    return "".join(f"- {line}\n" for line in (*per_run, *rest)) + "\n"


def run_notes(runs: list[Run]) -> list[str]:
    """What a reader of these runs must know (files not counted, unfinished episodes left out), one line each."""
    return [f"{r.label}: {n}" for r in runs for n in r.notes]


def default_out(cfg: RunConfig, runs: Sequence[Run] | Sequence[PlantDir], name: str) -> Path:
    """`<sweep folder>/<name>` for one sweep folder, else `<first run>/<name>`."""
    given = [Path(r).expanduser() for r in cfg.runs]
    if len(given) == 1 and is_sweep_folder(given[0]):
        return given[0] / name
    return runs[0].path / name
