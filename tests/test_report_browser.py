"""The HTML report as a browser renders it (headless Chromium, no network)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from ncp_local.report import build_report
from ncp_local.report.runs import attach_specs, load_runs
from test_report import make_run, write_dataset


def render(chromium: Path, page: Path, tmp: Path, name: str) -> tuple[bytes, str]:
    shot = tmp / f"{name}.png"
    res = subprocess.run(
        [
            str(chromium),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={tmp / 'profile'}",
            "--window-size=1280,1600",
            f"--screenshot={shot}",
            "--dump-dom",
            page.as_uri(),
        ],
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
