"""A report's index page as headless Chromium lays it out: its height, where each section starts, and
the tables wider than their frame, at 1,280 and 1,000 px.

Usage: python scripts/report_page.py REPORT/index.html [--chromium /usr/bin/chromium] [--shots PREFIX]

The height is the page as it opens (folded sections closed); the section tops and the tables are read
with every section open, so a folded table wider than the page is found too. `--shots PREFIX` also
writes PREFIX-1280.png and PREFIX-1000.png (the first 1,000 px of the page).
"""

from __future__ import annotations

import argparse
import html
import json
import re
import subprocess
import tempfile
from pathlib import Path

PROBE = """
const height = document.documentElement.scrollHeight;
document.querySelectorAll('details').forEach(d => { d.open = true; });
const page = document.documentElement.clientWidth;
const wide = [...document.querySelectorAll('table')].map(t => ({
    table: t.className, width: t.scrollWidth, frame: t.parentElement.clientWidth}))
  .filter(t => t.width > t.frame + 1 || t.width > page);
const tops = [...document.querySelectorAll('h2')].map(h =>
    [h.innerText, Math.round(h.getBoundingClientRect().top + window.scrollY)]);
return {height, open: document.documentElement.scrollHeight, wide, tops};
"""


def chromium(binary: str, profile: str, *extra: str) -> list[str]:
    return [
        binary, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", f"--user-data-dir={profile}", *extra,
    ]  # fmt: skip


def probe(page: Path, width: int, binary: str) -> dict:
    copy = page.with_name(f"{page.stem}.probe.html")
    hook = (
        "<script>window.addEventListener('load',()=>setTimeout(()=>{const r=(()=>{" + PROBE + "})();"
        "const p=document.createElement('pre');p.id='probe-out';p.textContent=JSON.stringify(r);"
        "document.body.appendChild(p);},500));</script>"
    )
    copy.write_text(page.read_text(encoding="utf-8").replace("</body>", hook + "</body>"), encoding="utf-8")
    try:
        with tempfile.TemporaryDirectory() as profile:
            args = (f"--window-size={width},1000", "--virtual-time-budget=3000", "--dump-dom", copy.as_uri())
            done = subprocess.run(chromium(binary, profile, *args), capture_output=True, text=True, timeout=300)
    finally:
        copy.unlink()
    found = re.search(r'<pre id="probe-out">(.*?)</pre>', done.stdout, re.S)
    if not found:
        raise SystemExit(done.stderr[-2000:])
    return json.loads(html.unescape(found.group(1)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("page", type=Path)
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    ap.add_argument("--shots", help="write PREFIX-<width>.png")
    a = ap.parse_args()
    page = a.page.resolve()
    for width in (1280, 1000):
        got = probe(page, width, a.chromium)
        print(f"{width} px: {got['height']} px tall ({got['open']} with every section open)")
        print(f"  tables wider than their frame: {got['wide'] or 'none'}")
        for title, top in got["tops"]:
            print(f"  {top:>6} px  {title}")
        if a.shots:
            with tempfile.TemporaryDirectory() as profile:
                shot = f"--screenshot={a.shots}-{width}.png"
                args = (f"--window-size={width},1000", "--hide-scrollbars", shot, page.as_uri())
                subprocess.run(chromium(a.chromium, profile, *args), capture_output=True, timeout=300, check=True)


if __name__ == "__main__":
    main()
