"""The HTML report as a browser renders it (headless Chromium, no network)."""

from __future__ import annotations

import html
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from cli_runner import ROOT, run_cli
from helpers import headless_chromium
from ncp_local.protocol.spec import load_dataset
from ncp_local.protocol.trials import story_of
from ncp_local.report import build_report
from ncp_local.report.runs import attach_specs, load_runs
from test_report import make_run, write_dataset


def render(chromium: Path, page: Path, tmp: Path, name: str) -> tuple[bytes, str]:
    shot = tmp / f"{name}.png"
    res = subprocess.run(
        headless_chromium(
            chromium, tmp / "profile", "--window-size=1280,1600", f"--screenshot={shot}", "--dump-dom", page.as_uri()
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    return shot.read_bytes(), res.stdout


def distinct_colours(png: bytes, tmp: Path) -> int:
    from PIL import Image  # a matplotlib dependency

    path = tmp / "probe.png"
    path.write_bytes(png)
    with Image.open(path) as im:
        return len(im.convert("RGB").getcolors(maxcolors=1 << 20) or ())


def test_report_renders(chromium: Path, tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", write_dataset(tmp_path / "dataset"))
    runs = load_runs([str(run)])
    attach_specs(runs[0])
    out = tmp_path / "report"
    build_report(runs, out, resamples=200)

    png, dom = render(chromium, out / "index.html", tmp_path, "index")
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    assert distinct_colours(png, tmp_path) > 50  # text, badges and the plot, not a blank page
    assert len(re.findall(r'<tr class="episode"', dom)) == 5
    assert "<svg" in dom and "Survival" in dom
    # The sorting/filtering script ran in the browser: it updates the count label.
    assert "5 shown" in dom

    png, dom = render(chromium, out / "episodes" / "00-run" / "a.html", tmp_path, "episode")
    assert len(png) > 20_000 and distinct_colours(png, tmp_path) > 50
    conflict = re.search(r'<div class="conflict" data-type="fact">(.*?)</dl></div>', dom, re.S)
    assert conflict, "the conflict that ended the episode is highlighted"
    assert "initial fact 0 of a" in conflict.group(1) and "confirmed on review" in conflict.group(1)
    assert 'class="card turn conflict-turn" id="t2"' in dom  # turn id 1 = turn 2, the paper's count

    _, dom = render(chromium, out / "episodes" / "00-run" / "b.html", tmp_path, "escaped")
    assert "<script>alert" not in dom and "&lt;script&gt;alert" in dom  # model text stays text


def probe(chromium: Path, page: Path, tmp: Path, script: str, width: int = 1280) -> Any:
    """What `script` (a function body returning JSON-able data) returns in the page as the browser laid it
    out with every folded section (`details`) open: run on a copy of the page after load, its answer read
    back from the dumped DOM."""
    copy = page.with_name(f"{page.stem}.probe.html")
    hook = (
        # Half a second after load: a page's own scripts finish first (the site adds its copy buttons then).
        "<script>window.addEventListener('load',()=>setTimeout(()=>{let r;"
        "document.querySelectorAll('details').forEach(d=>{d.open=true;});try{r=(()=>{" + script + "})();}"
        "catch(e){r={probe_error:String(e)};}"
        "const p=document.createElement('pre');p.id='probe-out';p.textContent=JSON.stringify(r);"
        "document.body.appendChild(p);},500));</script>"
    )
    copy.write_text(page.read_text(encoding="utf-8").replace("</body>", hook + "</body>"), encoding="utf-8")
    try:
        res = subprocess.run(
            headless_chromium(
                chromium,
                tmp / "profile",
                f"--window-size={width},1000",
                "--virtual-time-budget=3000",
                "--dump-dom",
                copy.as_uri(),
            ),
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        copy.unlink()
    found = re.search(r'<pre id="probe-out">(.*?)</pre>', res.stdout, re.S)
    assert found, res.stderr[-2000:]
    got = json.loads(html.unescape(found.group(1)))
    assert not (isinstance(got, dict) and "probe_error" in got), got
    return got


# Runs whose labels are long (four differing keys), each story played twice: the report's index with its
# endings and trials sections, and episode pages with commitments satisfied.
LONG = ("narrator.temperature=0.35", "player.temperature=0.9", "auditor.temperature=0.1", "seed=7")


@pytest.fixture(scope="module")
def long_labels_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("long-labels")
    common = ("engine=scripted", "max_turns=6", "trials.count=2", "progress=false")
    for name, extra in (("a", ()), ("b", LONG)):
        done = run_cli(*common, f"out_dir={tmp / name}", *extra)
        assert done.returncode == 0, done.stderr
    rep = run_cli("mode=report", f"runs=[{tmp / 'a'},{tmp / 'b'}]", f"report.out={tmp / 'report'}")
    assert rep.returncode == 0, rep.stderr
    return tmp / "report"


@pytest.mark.parametrize("width", [1280, 1000])
def test_report_prose_renders_code_spans_and_tables_fit_their_frame(
    chromium: Path, long_labels_report: Path, tmp_path: Path, width: int
) -> None:
    got = probe(
        chromium,
        long_labels_report / "index.html",
        tmp_path,
        """
        const prose = [...document.querySelectorAll('p, div.warn')].map(p => p.innerText);
        const frames = [...document.querySelectorAll('div.scroll')].map(d => ({
            table: d.querySelector('table').className, scroll: d.scrollWidth, width: d.clientWidth}));
        const label = document.querySelector('table.summary tbody tr:last-child td:first-child');
        const span = label.querySelector('.label');
        const lines = span.getClientRects().length;
        return {prose, frames, codes: document.querySelectorAll('p code').length,
                title: span.title, shown: span.innerText, lines,
                ran: [...document.querySelectorAll('ul.ran li')].map(l => l.innerText),
                past: [...document.querySelectorAll('table')].filter(t =>
                    t.getBoundingClientRect().right > document.documentElement.clientWidth).map(t => t.className),
                lineHeight: parseFloat(getComputedStyle(span).lineHeight), height: span.getBoundingClientRect().height};
        """,
        width,
    )
    # The prose's Markdown code spans are rendered (`max_turns` in the endings note), none left literal.
    assert got["codes"] >= 3
    assert not [p for p in got["prose"] if "`" in p]
    # Every table fits the page's width (1280 and 1000 px) inside its frame, every folded section open:
    # nothing hidden past the right edge.
    assert {f["table"] for f in got["frames"]} >= {"summary", "counts endings", "counts bands", "cost"}
    assert [f for f in got["frames"] if f["scroll"] > f["width"]] == [] and got["past"] == []
    # The run is named by what sets it apart, shortened to two lines at most, the name whole on hover; its
    # settings in full once, in the legend above.
    assert got["title"] == "narrator.temperature=0.35 player.temperature=0.9 auditor.temperature=0.1 +1"
    # Two lines at 1280 px; at 1000 px the tables stay whole and the label takes up to five.
    assert got["shown"] != got["title"] and got["height"] <= (2.5 if width == 1280 else 5.5) * got["lineHeight"]
    assert any(line.endswith(" ".join(LONG)) for line in got["ran"])


def test_report_episode_page_shows_each_commitments_text(
    chromium: Path, long_labels_report: Path, tmp_path: Path
) -> None:
    pages = sorted((long_labels_report / "episodes").rglob("*~t1.html"))
    page = next(p for p in pages if "class=sat>" in p.read_text())
    got = probe(
        chromium,
        page,
        tmp_path,
        "return [...document.querySelectorAll('article.turn li.sat, article.turn li.unsat')].map(l => l.innerText);",
    )
    spec = next(s for s in load_dataset(ROOT / "specs").specs if s.id == story_of(page.stem))
    texts = {c.id: c.description for c in spec.commitments}
    assert got
    for line in got:
        cid = re.search(r"(c_\d+)", line)
        assert cid and texts[cid.group(1)] in line, line


# Two scripted runs whose window fills at turn 3 for half the episodes, differing only in the player's
# condition: what ran, one meaning of "censored", intervals that stay whole, levels and units, the plots.
CENSORED = ("engine=scripted", "max_turns=6", "trials.count=2", "progress=false", "engine.context_limit_turn=3")


@pytest.fixture(scope="module")
def censored_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("censored")
    for name, condition in (("adv", "adversarial"), ("nat", "natural")):
        done = run_cli(*CENSORED, "engine.context_limit_share=0.5", f"condition={condition}", f"out_dir={tmp / name}")
        assert done.returncode == 0, done.stderr
    rep = run_cli("mode=report", f"runs=[{tmp / 'adv'},{tmp / 'nat'}]", f"report.out={tmp / 'report'}")
    assert rep.returncode == 0, rep.stderr
    return tmp / "report"


REPORT_PAGE = """
const text = el => el ? el.innerText : null;
const ivs = [...document.querySelectorAll('.iv')].map(e => {
    const tops = new Set([...e.getClientRects()].filter(r => r.width > 0).map(r => Math.round(r.top)));
    return [e.innerText, tops.size];
});
const endings = [...document.querySelectorAll('table.counts.endings tbody tr')].map(tr =>
    [...tr.cells].map(td => td.innerText));
const head = [...document.querySelectorAll('table.counts.endings thead th')]
    .map(th => th.innerText.replace(/\\s+/g, ' '));
const comments = [];
const walk = document.createTreeWalker(document.body, NodeFilter.SHOW_COMMENT);
while (walk.nextNode()) comments.push(walk.currentNode.nodeValue.trim());
return {ran: [...document.querySelectorAll('ul.ran li')].map(text),
        scripted: [...document.querySelectorAll('div.scripted')].map(text),
        rows: [...document.querySelectorAll('table.summary tbody tr')].map(tr => ({
            ran: text(tr.querySelector('.ran')), stopped: text(tr.querySelector('.censored'))})),
        shown: [...document.querySelectorAll('table.episodes')].map(t =>
            t.querySelectorAll('tr[data-termination="context_limit"]').length),
        ivs, endings, head, comments,
        notes: [...document.querySelectorAll('p.muted')].map(text),
        body: document.body.innerText};
"""


@pytest.mark.parametrize("width", [1280, 1000])
def test_report_says_what_ran_and_what_was_censored(
    chromium: Path, censored_report: Path, tmp_path: Path, width: int
) -> None:
    got = probe(chromium, censored_report / "index.html", tmp_path, REPORT_PAGE, width)
    # What ran: each run's engine, the scripted line, and the setting a scripted engine never reads.
    assert len(got["ran"]) == 2 and all("engine scripted, no model" in line for line in got["ran"])
    assert any("measure the rig" in s for s in got["scripted"])
    assert any("condition.name" in s and "does not read" in s for s in got["scripted"])
    assert [r["ran"] for r in got["rows"]] == ["engine: scripted"] * 2
    # One meaning of "censored": the window's stops are named context_limit, and every place agrees.
    assert "censored</div>" not in got["body"] and not any(
        r["stopped"] and "censored" in r["stopped"] for r in got["rows"]
    )
    stopped = [int(r["stopped"].split()[0]) for r in got["rows"]]
    assert stopped[0] > 0 and got["shown"] == stopped
    col = got["head"].index("context_limit (censored)")
    assert [int(row[col]) for row in got["endings"]] == stopped
    assert any("max_turns (censored)" == h for h in got["head"])
    # Intervals never wrap inside themselves, at either width.
    assert got["ivs"] and [iv for iv in got["ivs"] if iv[1] != 1] == []
    # The notes carry the level and the units, as results.md does.
    noise = next(n for n in got["notes"] if "Smallest real differences" in n)
    assert "at the 95% level" in noise and "squared percentage points" in noise and "inf" in noise
    # Plots: the identical curve is named, the marks are context_limit, the endings' shares are of plays.
    assert any("identical to condition.name=adversarial" in c for c in got["comments"])
    assert any("(+: context_limit)" in c for c in got["comments"])
    assert "plays (%)" in got["comments"] and "stories (%)" not in got["comments"]


def test_report_plots_hold_the_last_step(censored_report: Path) -> None:
    from ncp_local.report.plots import passk_figure
    from ncp_local.report.trials import run_trials

    runs = load_runs([str(censored_report.parent / "adv")])
    fig = passk_figure(run_trials(runs))
    ax = fig.axes[0]
    assert ax.get_xlim()[1] > 6  # t = max_turns is inside the frame, its step drawn for half a turn
    assert max(max(line.get_xdata()) for line in ax.get_lines()) == pytest.approx(6.5)
    md = (censored_report / "results.md").read_text()
    assert "| bound hits | engine |" in md and "Scripted engine: no model ran" in md
