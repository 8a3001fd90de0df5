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


# Per code element in a table cell (the key column aside): each place its text wraps, as the character
# before the break; wrapping may follow a separator or a space, never fall inside a name.
CELL_CODE_BREAKS = """
const out = [];
for (const code of document.querySelectorAll('.md-typeset table:not([class]) td:not(:first-child) code')) {
    const text = code.textContent;
    const walker = document.createTreeWalker(code, NodeFilter.SHOW_TEXT);
    const chars = [];
    while (walker.nextNode()) {
        const node = walker.currentNode;
        for (let i = 0; i < node.length; i++) {
            const r = document.createRange();
            r.setStart(node, i);
            r.setEnd(node, i + 1);
            const rect = [...r.getClientRects()].find(x => x.width > 0);
            chars.push([node.data[i], rect ? Math.round(rect.top) : null]);  // a collapsed space has none
        }
    }
    let top = null;
    for (let i = 0; i < chars.length; i++) {
        if (chars[i][1] === null) continue;
        if (top !== null && chars[i][1] > top) out.push([text, chars[i - 1][0]]);  // the character before the break
        top = chars[i][1];
    }
}
return out;
"""
# Per `# comment` of a code block: its lines' left edges (a wrapped comment's later lines sit further right),
# and whether shell builtins are coloured as keywords.
COMMENTS = """
const code = document.querySelector('.md-typeset pre > code');
const base = code.getBoundingClientRect().left;
const comments = [...document.querySelectorAll('.md-typeset pre > code .c1')].map(c => {
    const rects = [...c.getClientRects()];
    const range = document.createRange();
    range.selectNodeContents(c);
    const lines = [...range.getClientRects()].filter(r => r.width > 0).map(r => Math.round(r.left - base));
    return {text: c.textContent.slice(0, 40), lines};
});
const builtins = [...document.querySelectorAll('.md-typeset pre > code .nb')].map(b =>
    [b.textContent, getComputedStyle(b).color === getComputedStyle(b.parentElement).color]);
return {comments, builtins};
"""


@pytest.mark.parametrize("width", [1280, 1000])
@pytest.mark.parametrize("page", ["reference/configuration.html", "guide/first-run.html"])
def test_code_in_table_cells_breaks_only_at_separators(
    chromium: Path, site: Path, tmp_path: Path, page: str, width: int
) -> None:
    breaks = probe(chromium, site / page, tmp_path, CELL_CODE_BREAKS, width)
    # `build.lo|g`, `<mode>.l|og`, `NCP_MO|DELS_ROOT` before: now only after `/ . , =` or a space.
    assert [b for b in breaks if b[1] not in " /.,="] == []


@pytest.mark.parametrize("width", [1280, 1000])
def test_code_block_comments_wrap_with_an_indent_and_builtins_are_plain(
    chromium: Path, site: Path, tmp_path: Path, width: int
) -> None:
    got = probe(chromium, site / "guide" / "first-run.html", tmp_path, COMMENTS, width)
    assert got["comments"]
    for c in got["comments"]:
        first, *rest = c["lines"]
        # A comment stays beside its command or moves under it indented, never flush left where commands
        # start; its later lines are indented under its first.
        assert first > 0 and all(left > first for left in rest), c
    assert got["builtins"] and all(plain for _, plain in got["builtins"])  # `make test`, `export`: not keywords
