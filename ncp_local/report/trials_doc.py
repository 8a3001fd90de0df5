"""The trials section's text: the pass^k and noise-floor tables, their notes, each story's plays, and
the CSVs (the estimators are report/trials.py's)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..protocol.metrics import EpisodeMetrics
from .tables import csv_text, markdown_table
from .trials import RunTrials, columns_at


def _pct(x: float, d: int = 1) -> str:
    return "n/a" if math.isnan(x) else f"{100 * x:.{d}f}"


def _num(x: float, d: int = 2) -> str:
    return "n/a" if math.isnan(x) else "inf" if math.isinf(x) else f"{x:.{d}f}"


Table = tuple[list[str], list[list[str]]]


def _pct_iv(x: float, lo: float, hi: float, why: str = "") -> str:
    if why:
        return "not estimable"
    return _pct(x) if math.isnan(lo) or math.isnan(x) else f"{_pct(x)} [{_pct(lo)}, {_pct(hi)}]"


def _why(rt: RunTrials, k: int, t: int) -> str:
    reasons = rt.unestimable.get(k, ())
    return reasons[t] if t < len(reasons) else ""


def passk_table(rt: RunTrials) -> Table:
    """S(t) and pass^k(t) in percent at `columns_at` turns, each with its interval ("not estimable" where
    too few stories are observed: `not_estimable`, and `trials_notes` says why)."""
    ts = columns_at(rt.max_turns)
    rows = [["S(t) %", *(_pct(rt.survival[t]) for t in ts)]]
    rows += [
        [f"pass^{k} %", *(_pct_iv(c[t], rt.bands[k][0][t], rt.bands[k][1][t], _why(rt, k, t)) for t in ts)]
        for k, c in rt.curves.items()
    ]
    return ["", *(f"t={t}" for t in ts)], rows


def trials_notes(rt: RunTrials) -> list[str]:
    """What the run's two tables cannot show: where pass^k is not estimable and why, intervals of zero width,
    and variances that are 0 (each says the sample shows no spread there, not that there is none)."""
    ts = columns_at(rt.max_turns)
    notes = []
    for k in rt.curves:
        gaps = [(t, _why(rt, k, t)) for t in ts if _why(rt, k, t)]
        if gaps:
            notes.append(f"pass^{k} not estimable at " + "; ".join(f"t={t}: {why}" for t, why in gaps) + ".")
    flat = [
        f"pass^{k} at t={t}"
        for k, c in rt.curves.items()
        for t in ts
        if not math.isnan(c[t]) and rt.bands[k][0][t] == rt.bands[k][1][t]
    ]
    if flat:
        notes.append(
            f"Interval of zero width ({', '.join(flat)}): every bootstrap draw of the {len(rt.stories)} stories "
            "gave the same value; the band says nothing about the spread there."
        )
    n = len(rt.stories)
    if flat_w := [x.label for x in rt.noise if x.within == 0]:
        notes.append(
            f"Within-story variance 0 for {', '.join(flat_w)}: every story's plays agree on it, so the replay "
            f"differences are 0; with {n} stories the sample shows no play-to-play noise, not that there is none."
        )
    if flat_b := [x.label for x in rt.noise if x.between == 0]:
        notes.append(
            f"Between-story variance 0 for {', '.join(flat_b)}: the stories' means differ no more than their "
            "plays' noise predicts (within / between: inf)."
        )
    return notes


def noise_table(rt: RunTrials, level: float) -> Table:
    header = [
        "metric",
        "mean",
        "within-story var",
        "between-story var",
        "within / between",
        "smallest real diff, replay",
        "smallest real diff, other stories",
        "found 80% of the time, replay",
        "found 80% of the time, other stories",
    ]
    rows = [
        [n.label, _num(n.mean), _num(n.within), _num(n.between), _num(n.ratio), _num(n.mdd_replay), _num(n.mdd_runs)]
        + [_num(n.mdd_replay_80), _num(n.mdd_runs_80)]
        for n in rt.noise
    ]
    return header, rows


NOISE_NOTE = (
    "pass^k(t): the chance that k plays of a story all survive t turns, from each story's c of n plays seen "
    "surviving as C(c,k)/C(n,k), averaged over stories with the plays seen at t weighted by 1/G(t)^k (G: the "
    "Kaplan-Meier chance a play is not yet censored), as a ratio of weights, so never above 1; pass^1 = S(t) "
    "when every story has as many plays; `not estimable` where too few stories are seen at t, or censoring "
    "follows too few through t (the note says why); [interval]: Jeffreys' interval at the effective sample "
    "size of a bootstrap over stories. Noise floor: within-story variance (one play's sampling noise), "
    "between-story variance (var of story means minus within/n), and the smallest difference between two "
    "runs of this size the noise allows to call real: z*sqrt(2*within/(S*k)) for two replays of the same S "
    "stories, z*sqrt(2*(between/S + within/(S*k))) for two runs of S other stories. A test finds a "
    "difference that size half the time; to find one 80% of the time it must be (z + 0.84)/z times larger "
    "(the last two columns), or the run needs about twice the plays (docs/guide/trials.md)."
)


# What the noise table's figures are measured in, and what its `inf` means.
NOISE_UNITS = (
    "Units: the mean and the differences are in the metric's own unit (turns for avg turns, percentage "
    "points for the % metrics); the variances in its square (squared turns, squared percentage points). "
    "`inf` in within / between: the between-story variance is 0, the stories do not differ beyond the "
    "noise (`nan`: no spread at all)."
)


def noise_note(level: float) -> str:
    """The note under the noise tables, its level stated (the Markdown and the HTML say the same)."""
    return f"Smallest real differences at the {level:.0%} level. " + NOISE_NOTE + " " + NOISE_UNITS


def trials_markdown(rts: Sequence[RunTrials], level: float) -> str:
    parts = []
    for rt in rts:
        parts += [
            f"### {rt.label}: {rt.trials} trials of {len(rt.stories)} stories",
            "",
            markdown_table(*passk_table(rt)),
            "",
            markdown_table(*noise_table(rt, level)),
            "",
            *(f"{n}\n" for n in trials_notes(rt)),
        ]
    return "\n".join(parts + [noise_note(level)])


def _ending(m: EpisodeMetrics) -> str:
    return f"t{m.trial}:{m.ending}@{m.turns}"


STORY_HEADER = ("run", "spec_id", "plays", "survived", "turns min", "turns median", "turns max", "turns sd", "endings")


def story_rows(rts: Sequence[RunTrials]) -> list[list[object]]:
    """Per story: its scored plays, those that survived (ended without a conflict), the spread of
    their turns, and each trial's ending and turns (`t1:fact@7`)."""
    rows: list[list[object]] = []
    for rt in rts:
        for s in rt.stories:
            turns = sorted(m.turns for m in s.plays)
            n = len(turns)
            mean = sum(turns) / n if n else math.nan
            sd = math.sqrt(sum((x - mean) ** 2 for x in turns) / (n - 1)) if n > 1 else math.nan
            rows.append(
                [
                    rt.label,
                    s.spec_id,
                    n,
                    sum(m.termination != "conflict" for m in s.plays),
                    turns[0] if n else "",
                    (turns[(n - 1) // 2] + turns[n // 2]) / 2 if n else "",
                    turns[-1] if n else "",
                    _num(sd),
                    " ".join(_ending(m) for m in s.plays),
                ]
            )
    return rows


def stories_markdown(rts: Sequence[RunTrials]) -> str:
    return markdown_table(STORY_HEADER, story_rows(rts), left=2)


def passk_csv(rts: Sequence[RunTrials]) -> str:
    def cell(x: float) -> object:
        return "" if math.isnan(x) else round(x, 6)

    rows = [
        [rt.label, k, t, cell(c[t]), cell(rt.bands[k][0][t]), cell(rt.bands[k][1][t]), round(rt.survival[t], 6)]
        + [_why(rt, k, t)]
        for rt in rts
        for k, c in rt.curves.items()
        for t in range(rt.max_turns + 1)
    ]
    return csv_text(["run", "k", "t", "pass_k", "pass_k_lo", "pass_k_hi", "survival", "not_estimable"], rows)


def noise_csv(rts: Sequence[RunTrials]) -> str:
    rows = [
        [rt.label, len(rt.stories), rt.trials, n.metric, *(_num(x, 6) for x in (n.mean, n.within, n.between))]
        + [_num(n.ratio, 6), _num(n.mdd_replay, 6), _num(n.mdd_runs, 6), _num(n.mdd_replay_80, 6)]
        + [_num(n.mdd_runs_80, 6)]
        for rt in rts
        for n in rt.noise
    ]
    header = ["run", "stories", "trials", "metric", "mean", "within_var", "between_var", "ratio"]
    return csv_text([*header, "mdd_replay", "mdd_other_stories", "mdd80_replay", "mdd80_other_stories"], rows)


def stories_csv(rts: Sequence[RunTrials]) -> str:
    return csv_text(STORY_HEADER, story_rows(rts))
