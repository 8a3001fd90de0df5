"""A report read in five minutes: the answer first in the terminal (at most 40 lines, the files last) and
in the HTML (what ran, results, verdicts, endings before every folded detail)."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from cli_runner import run_cli
from ncp_local.report.brief import BUDGET, Section, fit


def test_fit_says_a_section_in_one_line_when_it_does_not_fit() -> None:
    closing = ["report: /out (results.md)"]
    small = Section("a:", ["- one"], "a: in the files")
    big = Section("b:", [f"- {i}" for i in range(50)], "b: in the files")
    tail = Section("c:", ["- last"], "c: in the files")
    lines = fit([small, big, tail], closing, budget=12).split("\n")
    assert len(lines) <= 12 and lines[-1] == closing[0]
    assert lines[:2] == ["a:", "- one"] and "b: in the files" in lines and "- 49" not in lines
    assert "- last" in lines  # the section after the one that did not fit still has its room
    # A section of several lines in one string counts each line.
    lines = fit([Section("t:", ["| a |\n|---|\n| 1 |"], "t: elsewhere")], [], budget=4).split("\n")
    assert lines == ["t: elsewhere", ""]


def _scripted(out: Path, *extra: str) -> Path:
    done = run_cli("engine=scripted", "max_turns=6", f"out_dir={out}", "progress=false", *extra)
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture(scope="module")
def three_runs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("brief")
    return [
        _scripted(root / "a"),
        _scripted(root / "b", "condition=natural"),
        _scripted(root / "c", "trials.count=2", "engine.context_limit_turn=3", "engine.context_limit_share=0.5"),
    ]


class _Headings(HTMLParser):
    """Each <h2>'s text, and whether it sits inside a <details>."""

    def __init__(self) -> None:
        super().__init__()
        self.depth = 0
        self.heads: list[tuple[str, bool]] = []
        self._in_h2 = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.depth += tag == "details"
        if tag == "h2":
            self._in_h2 = True
            self.heads.append(("", self.depth > 0))

    def handle_endtag(self, tag: str) -> None:
        self.depth -= tag == "details"
        self._in_h2 = self._in_h2 and tag != "h2"

    def handle_data(self, data: str) -> None:
        if self._in_h2:
            text, folded = self.heads[-1]
            self.heads[-1] = (text + data, folded)


def test_a_three_run_report_gives_the_answer_first(three_runs: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "rep"
    runs = ",".join(map(str, three_runs))
    done = run_cli("mode=report", f"runs=[{runs}]", f"report.out={out}", "report.resamples=100", "progress=false")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.rstrip("\n").split("\n")
    assert len(lines) <= BUDGET
    # The answer in order: what ran, the results, the verdicts, what ended the stories; the files last.
    order = ["what ran:", "results:", "comparisons with the baseline", "what ended each story:"]
    at = [next(i for i, line in enumerate(lines) if line.startswith(head)) for head in order]
    assert at == sorted(at)
    assert "Scripted engine: no model ran" in done.stdout
    assert any(line.startswith("- condition=natural vs the baseline, 3 stories: ") for line in lines)
    # The last line names the folder and every file written there, each of which exists.
    last = lines[-1]
    assert last.startswith(f"report: {out} (") and "results.md" in last and "index.html" in last
    listed = []
    for item in last.split(" (", 1)[1].rstrip(")").split(", "):  # `results.md/.csv`: one stem's files
        first, *more = item.split("/.")
        stem, ext = first.rsplit(".", 1)
        listed += [f"{stem}.{e}" for e in (ext, *more)]
    assert {"results.md", "results.csv", "compare.csv", "index.html"} <= set(listed)
    assert all((out / name).is_file() for name in listed)
    # Each run is named by what sets it apart from the first, in every file; its settings in full once.
    labels = [line.split(",")[0] for line in (out / "results.csv").read_text().splitlines()[1:]]
    assert labels == ["baseline", "condition=natural", "context_limit_turn=3 context_limit_share=0.5 trials=2"]
    assert any(line.endswith("engine.context_limit_turn=3 engine.context_limit_share=0.5") for line in lines)
    # results.md too: the verdicts and the endings before each figure's test.
    md = (out / "results.md").read_text()
    assert (
        md.index("## Verdicts against the baseline") < md.index("## What ended each story") < md.index("## Comparisons")
    )
    # The full tables and sentences are in the files, not the terminal.
    assert "- turns kept: " not in done.stdout and "- turns kept: " in (out / "results.md").read_text()

    parser = _Headings()
    parser.feed((out / "index.html").read_text())
    answer = [text for text, folded in parser.heads if not folded]
    details = [text for text, folded in parser.heads if folded]
    assert answer == ["Results", "Comparisons", "What ended each story"]
    for section in ("Survival", "Failure modes", "The auditor's error", "Cost by role and stage", "Trials"):
        assert any(text.startswith(section) for text in details), section
    assert sum(text.startswith("Episodes: ") for text in details) == 3
    # Every answer heading comes before the first folded one in the page.
    page = (out / "index.html").read_text()
    assert page.index("<h2>What ended each story</h2>") < page.index("<details")


def test_mode_compare_prints_the_answer_and_writes_the_rest(three_runs: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    runs = ",".join(map(str, three_runs))
    done = run_cli("mode=compare", f"runs=[{runs}]", f"report.out={out}", "report.resamples=100", "progress=false")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.rstrip("\n").split("\n")
    assert len(lines) <= 20 and lines[-1] == f"compare: {out} (compare.md, compare.csv)"
    verdicts = [line for line in lines if " vs the baseline, 3 stories: " in line]
    assert len(verdicts) == 2
    # The censored run's as-played figures get no verdict, and the line says why.
    assert "no verdict on 7 as-played figures: the window stopped 16.7% of" in verdicts[1]
    text = (out / "compare.md").read_text()
    assert text.count("- turns kept: ") == 2 and "- turns kept: " not in done.stdout


def test_conflict_free_carries_its_unit_in_every_table(three_runs: list[Path], tmp_path: Path) -> None:
    # A count of plays in the results table, a share in the comparisons and trials: each named for what it is.
    out = tmp_path / "rep"
    runs = ",".join(map(str, three_runs))
    done = run_cli("mode=report", f"runs=[{runs}]", f"report.out={out}", "report.resamples=50", "report.html=false")
    assert done.returncode == 0, done.stderr
    named = set()
    for page in ("results.md", "trials.md"):
        for line in (out / page).read_text().splitlines():
            if line.startswith("|"):
                named |= {cell.strip() for cell in line.split("|") if "conflict-free" in cell}
            elif "conflict-free" in line:
                named |= set(re.findall(r"conflict-free[ %a-z]*?(?=[:(;,]|$)", line))
    assert named and named <= {"conflict-free plays", "conflict-free %"}, named
    assert {"conflict-free plays", "conflict-free %"} <= named
    header = (out / "results.csv").read_text().splitlines()[0].split(",")
    assert "conflict_free" in header  # the count, as results.md's `conflict-free plays`


def test_a_report_beside_the_paper_says_where_and_what_ran(three_runs: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "rep"
    runs = ",".join(map(str, three_runs))
    done = run_cli(
        "mode=report", f"runs=[{runs}]", "compare.paper=table1/GPT-4o-mini", f"report.out={out}",
        "report.resamples=50", "report.html=false",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = done.stdout.rstrip("\n").split("\n")
    assert len(lines) <= BUDGET and lines[-1].startswith(f"report: {out} (")
    (said,) = [line for line in lines if line.startswith("beside the paper")]
    assert "baseline beside table1/GPT-4o-mini" in said and said.endswith("in results.md")
    md = (out / "results.md").read_text()
    assert md.count("What ran: engine scripted, no model (every role).") == 3 and "smollm2" not in md
