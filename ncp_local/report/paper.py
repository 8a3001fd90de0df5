"""The paper's published figures beside a run: each figure, the difference, and how the setups differ.

The figures are `paper_figures.yaml` (a package file: the table, row and column of each, and the setup
it was run under). A run is set beside the row `compare.paper` names, or else beside the rows whose
narrator, method and input match the run's (said so in the section). For each figure both have:

- the difference, run minus paper, with an interval that counts both samples' error: the run's from
  its story bootstrap (`protocol/resample.py`), the paper's from its design, 100 stories played once,
  as se^2 = p (1 - p) / 100 for a share and, for a mean (avg turns, traj %, sat %), whose spread the
  paper does not print, s^2 / 100 with s the run's own standard deviation per story (the one
  assumption: the two runs' stories spread alike). Interval: d +- z sqrt(se_run^2 + se_paper^2);
- figures that depend on the turn cap (all but S(t) at t no later than both caps) are not set
  against a paper figure when the caps differ: the values are shown, the difference is not.

Then every way the two setups differ (models, method, input, turn cap, stories and plays, context
window and censoring share, dataset, decoding), one line each: a difference is only the narrator's
when nothing else in that list differs.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib.resources import files
from typing import Any

import numpy as np
import yaml
from scipy import stats

from ..config import SCRIPTED
from ..errors import InputError
from .compare import scored_stories
from .paired import MEANS, Pool, measurer, take
from .ran import what_ran
from .runs import Run
from .tables import markdown_table

PAPER_FILE = "paper_figures.yaml"
LABELS: dict[str, str] = {k: label for k, label in MEANS} | {"turns_kept": "turns kept"}
# Figures that are means of a per-episode value (the paper prints no spread for them).
MEAN_FIGURES = ("avg_turns", "trajectory_pct", "satisfied_pct")


@dataclass(frozen=True)
class PaperRow:
    id: str  # as compare.paper names it: table1/GPT-4o-mini
    table: str
    row: str
    setup: dict[str, str]  # narrator, player, auditor, method, input
    figures: dict[str, float]  # compare.py's figure keys: avg_turns, fact_pct, S(20) ...


@dataclass(frozen=True)
class Paper:
    source: str
    design: dict[str, Any]  # stories, plays, max_turns, decoding ...
    rows: dict[str, PaperRow]


@cache
def paper() -> Paper:
    doc = yaml.safe_load((files("ncp_local.report") / PAPER_FILE).read_text(encoding="utf-8"))
    rows = {
        rid: PaperRow(rid, r["table"], r["row"], dict(r["setup"]), {k: float(v) for k, v in r["figures"].items()})
        for rid, r in doc["rows"].items()
    }
    return Paper(doc["source"], dict(doc["design"]), rows)


def row_named(name: str) -> PaperRow:
    """The row `compare.paper` names; an unknown one is refused, the known ones named."""
    rows = paper().rows
    if name not in rows:
        raise InputError("config", "compare.paper", f"no paper row {name!r} (known: {', '.join(rows)})")
    return rows[name]


def _norm(name: object) -> str:
    return re.sub(r"[^a-z0-9]", "", str(name).lower())


def _model(run: Run, role: str) -> str:
    """The role's model as the run recorded what ran (report/ran.py): a scripted role ran none."""
    model = what_ran(run.manifest).model(role)
    return "scripted, no model" if model == SCRIPTED else model


def _method(run: Run) -> str:
    name = str(((run.manifest.get("config") or {}).get("method") or {}).get("name", "baseline"))
    return "hiagent" if "hiagent" in name.lower() else "baseline"


def _input(run: Run) -> str:
    return str(((run.manifest.get("config") or {}).get("condition") or {}).get("name", "?"))


def matching_rows(run: Run) -> list[PaperRow]:
    """Rows whose narrator, method and input are the run's (the narrator by its name, spelling aside)."""
    narrator = _norm(_model(run, "narrator"))
    return [
        r
        for r in paper().rows.values()
        if _norm(r.setup["narrator"]) in narrator
        and r.setup["method"] == _method(run)
        and r.setup["input"] == _input(run)
    ]


@dataclass(frozen=True)
class Line:
    key: str
    label: str
    paper: float
    run: float
    diff: float  # run - paper (NaN: not comparable)
    lo: float
    hi: float
    note: str  # why there is no difference, or how the paper's error was taken


@dataclass(frozen=True)
class BesidePaper:
    run: str
    row: PaperRow
    how: str  # "compare.paper=..." or why the row was matched
    lines: tuple[Line, ...]
    differences: tuple[str, ...]  # how the setups differ, one line each
    scripted: bool  # the run's answers were the scripted engine's: it measures nothing
    ran: str  # what ran, from the manifest (report/ran.py): `engine scripted, no model (every role)`


def _paper_se(key: str, value: float, run_sd: float, n: int) -> float:
    if key in MEAN_FIGURES:
        return run_sd / math.sqrt(n)
    p = value / 100
    return 100 * math.sqrt(max(p * (1 - p), 0.0) / n)


def beside_paper(run: Run, row: PaperRow, how: str, level: float, resamples: int, seed: int) -> BesidePaper:
    design = paper().design
    n_paper = int(design["stories"])
    cap = run.max_turns
    same_cap = cap == int(design["max_turns"])
    by_story = scored_stories(run)
    pool = Pool([list(by_story.values())])
    # S(t) the paper states, where the run reached t.
    turns_at = [int(k[2:-1]) for k in row.figures if k.startswith("S(") and int(k[2:-1]) <= cap]
    measure = measurer(pool, cap, turns_at, True)
    keys = [k for k, _ in MEANS] + ["turns_kept"] + [f"S({t})" for t in turns_at]
    n = len(by_story)
    point = measure(take(pool, 0, np.arange(n)))[: len(keys)]
    rng = np.random.default_rng(seed)
    drawn = np.asarray([measure(take(pool, 0, rng.integers(0, n, size=n)))[: len(keys)] for _ in range(resamples)])
    se_run = drawn.std(axis=0, ddof=1) if resamples > 1 else np.full(len(keys), math.nan)
    # The run's spread per story (its plays averaged), for the paper's means.
    per_story = np.asarray([pool.values[:, take(pool, 0, np.asarray([k]))].mean(axis=1) for k in range(n)]).reshape(
        n, len(MEANS)
    )
    sd_story = per_story.std(axis=0, ddof=1) if n > 1 else np.full(len(MEANS), math.nan)
    z = float(stats.norm.ppf(0.5 + level / 2))
    lines = []
    for key, value in row.figures.items():
        label = LABELS.get(key, f"{key} %" if key.startswith("S(") else key)
        if key not in keys:
            lines.append(
                Line(key, label, value, math.nan, math.nan, math.nan, math.nan, f"the run has no t={key[2:-1]}")
            )
            continue
        i = keys.index(key)
        mine = float(point[i])
        if not same_cap and not key.startswith("S("):
            note = f"not compared: turn cap {cap} vs the paper's {design['max_turns']}"
            lines.append(Line(key, label, value, mine, math.nan, math.nan, math.nan, note))
            continue
        sd = float(sd_story[[k for k, _ in MEANS].index(key)]) if key in MEAN_FIGURES else math.nan
        se = math.sqrt(float(se_run[i]) ** 2 + _paper_se(key, value, sd, n_paper) ** 2)
        note = "paper's spread taken as the run's" if key in MEAN_FIGURES else "paper's error: binomial, 100 stories"
        d = mine - value
        lines.append(Line(key, label, value, mine, d, d - z * se, d + z * se, note))
    ran = what_ran(run.manifest)
    return BesidePaper(run.label, row, how, tuple(lines), setup_differences(run, row), ran.scripted, ran.line)


def setup_differences(run: Run, row: PaperRow) -> tuple[str, ...]:
    """Every way the run's setup differs from the row's, one line each (what is the same is not listed)."""
    design = paper().design
    cfg = run.manifest.get("config") or {}
    out = []
    if what_ran(run.manifest).scripted:
        out.append("engine: scripted (answers drawn at random; the run measures no model)")
    for role, theirs in (("narrator", row.setup["narrator"]), ("player", row.setup["player"])):
        if _norm(theirs) not in _norm(_model(run, role)):
            out.append(f"{role}: {_model(run, role)} (paper: {theirs})")
    if _norm(row.setup["auditor"]) not in _norm(_model(run, "auditor")):
        out.append(f"auditor: {_model(run, 'auditor')} (paper: {row.setup['auditor']})")
    if _method(run) != row.setup["method"]:
        out.append(f"method: {_method(run)} (paper: {row.setup['method']})")
    if _input(run) != row.setup["input"]:
        out.append(f"input: {_input(run)} (paper: {row.setup['input']})")
    if run.max_turns != int(design["max_turns"]):
        out.append(f"turn cap: {run.max_turns} (paper: {design['max_turns']})")
    stories = scored_stories(run)
    plays = max((len(p) for p in stories.values()), default=0)
    if len(stories) != int(design["stories"]) or plays != int(design["plays"]):
        out.append(f"stories x plays: {len(stories)} x {plays} (paper: {design['stories']} x {design['plays']})")
    agg = run.aggregate()
    windows = sorted({str(((cfg.get(r) or {}).get("model") or {}).get("max_model_len", "?")) for r in _ROLES})
    share = agg.censored / agg.scored if agg.scored else 0.0
    out.append(
        f"context window: {'/'.join(windows)} tokens, {share:.0%} of episodes censored by it "
        f"(paper: the API models' windows, {float(design['censored_share']):.0%} censored)"
    )
    ds = cfg.get("dataset") or {}
    specs = len((run.manifest.get("dataset") or {}).get("specs") or [])
    digest = str((run.manifest.get("dataset") or {}).get("sha256") or "?")[:12]
    if ds.get("name") != "ncp_bench" or specs != int(design["dataset_specs"]):
        out.append(
            f"dataset: {ds.get('name', '?')} with {specs} specs, sha256 {digest} "
            f"(paper: the official release, {design['dataset_specs']})"
        )
    else:
        # The paper names its release by its counts (Table 6), not by a digest: the version is not checked.
        out.append(
            f"dataset version: sha256 {digest}, {specs} specs (paper: the processed release, whose digest "
            "it does not give; its Table 6 counts are in paper_figures.yaml)"
        )
    nar = cfg.get("narrator") or {}
    decoding = (nar.get("temperature"), nar.get("top_p"), nar.get("max_tokens"))
    paper_decoding = (design["temperature"], design["top_p"], design["max_tokens"])
    if tuple(map(str, decoding)) != tuple(map(str, paper_decoding)):
        out.append(
            f"narrator decoding: temperature {decoding[0]}, top-p {decoding[1]}, max tokens {decoding[2]} "
            f"(paper: {paper_decoding[0]}, {paper_decoding[1]}, {paper_decoding[2]})"
        )
    return tuple(out)


_ROLES = ("narrator", "player", "auditor")


def rows_for(run: Run, named: str | None) -> list[tuple[PaperRow, str]]:
    """The rows to set the run beside: the named one, else the matching ones (with how each was chosen)."""
    if named:
        return [(row_named(named), f"compare.paper={named}")]
    rows = matching_rows(run)
    # Of several rows (GPT-4o-mini is in all four tables), those with the run's auditor too, if any.
    audited = [r for r in rows if _norm(r.setup["auditor"]) in _norm(_model(run, "auditor"))]
    how = "matched: the run's narrator ({}), method and input{} are the row's".format(
        _model(run, "narrator"), " and auditor" if audited else ""
    )
    return [(r, how) for r in (audited or rows)]


def _f(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{round(x, 2) + 0.0:.2f}"


def paper_markdown(items: Sequence[BesidePaper], level: float) -> str:
    if not items:
        return ""
    src = paper().source
    parts = []
    for b in items:
        head = (
            f"### {b.run} beside the paper's {b.row.table}, row {b.row.row}\n\nWhat ran: {b.ran}. {b.how}. "
            f"Source: {src}."
        )
        if b.scripted:
            head += "\n\n**A scripted run: its answers are random draws, so this comparison measures nothing.**"
        body = [
            [
                ln.label,
                _f(ln.paper),
                _f(ln.run),
                ("+" if round(ln.diff, 2) > 0 else "") + _f(ln.diff),
                "" if math.isnan(ln.diff) else f"[{_f(ln.lo)}, {_f(ln.hi)}]",
                ln.note,
            ]
            for ln in b.lines
        ]
        table = markdown_table(("figure", "paper", "run", "run - paper", f"{level:.0%} interval", "note"), body)
        diffs = "How the setups differ:\n\n" + "\n".join(f"- {d}" for d in b.differences)
        parts.append("\n\n".join((head, table, diffs)))
    return "\n\n".join(parts)
