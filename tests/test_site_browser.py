"""The documentation site as a browser lays it out (headless Chromium): command blocks show every
character, clear of the copy button; a table's key column never splits a key; tables fit the page."""

from __future__ import annotations

from pathlib import Path

import pytest

from test_docs import build_site
from test_report_browser import probe

# Per code block: is it scrolled (text past its right edge), does any text run under the copy button, and
# does the button copy the lines as written.
CODE_BLOCKS = """
return [...document.querySelectorAll('.md-typeset pre > code')].map(code => {
    const button = code.closest('pre').querySelector('.md-code__button, .md-clipboard');
    const b = button ? button.getBoundingClientRect() : null;
    const range = document.createRange();
    range.selectNodeContents(code);
    const under = b === null ? [] : [...range.getClientRects()].filter(r =>
        r.width > 0 && r.right > b.left && r.left < b.right && r.bottom > b.top && r.top < b.bottom);
    // The copy button copies the block's innerText: wrapping must leave it the source's lines.
    return {text: code.innerText.slice(0, 60), hidden: code.scrollWidth - code.clientWidth, under: under.length,
            button: b !== null, copied: code.innerText.trimEnd() === code.textContent.trimEnd()};
});
"""
# Per key cell: how many lines its key takes; per table: how far it runs past its frame.
KEY_CELLS = """
const keys = [...document.querySelectorAll('.md-typeset table:not([class]) td:first-child code')].map(c => {
    const r = document.createRange();
    r.selectNodeContents(c);
    const tops = new Set([...r.getClientRects()].filter(x => x.width > 0).map(x => Math.round(x.top)));
    return [c.innerText, tops.size];
});
const over = [...document.querySelectorAll('.md-typeset__scrollwrap')].map(w => w.scrollWidth - w.clientWidth);
return {keys, over};
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_site(tmp_path_factory.mktemp("site"))


def test_command_blocks_show_every_character_clear_of_the_copy_button(
    chromium: Path, site: Path, tmp_path: Path
) -> None:
    blocks = probe(chromium, site / "guide" / "first-run.html", tmp_path, CODE_BLOCKS)
    assert len(blocks) >= 2 and any("run.py" in b["text"] for b in blocks) and all(b["button"] for b in blocks)
    assert [b for b in blocks if b["hidden"] > 0] == []  # long lines wrap: no `# ...` cut off
    assert [b for b in blocks if b["under"]] == []  # no text under the copy button
    assert all(b["copied"] for b in blocks)  # and it copies the lines as written


def test_key_columns_keep_each_key_on_one_line(chromium: Path, site: Path, tmp_path: Path) -> None:
    got = probe(chromium, site / "reference" / "configuration.html", tmp_path, KEY_CELLS)
    keys = dict(got["keys"])
    assert {"concurrency", "trials.count", "trials.vary"} <= set(keys)
    assert [k for k, lines in got["keys"] if lines != 1] == []  # `trials.coun|t` split before
    assert got["over"] and max(got["over"]) <= 0  # the reference tables fit the text column
