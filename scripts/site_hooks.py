"""An mkdocs hook (mkdocs.yml `hooks:`): code in a table's cells may break only after a separator.

Each piece of such code between separators (`/`, `.`, `,`, `=`) and spaces becomes an unbreakable
span (docs/stylesheets/extra.css), with a `<wbr>` after each separator: a long path or default
(`${oc.env:NCP_MODELS_ROOT,/models}`) still wraps, at a separator or a space and never inside a name
(`build.lo|g`, `smollm2-|135m` before). Spans and `<wbr>` add no character: copying a cell gives the
code as written. A row's first cell (a key column, kept on one line) is left as it is.
"""

from __future__ import annotations

import re
from typing import Any

_ROW = re.compile(r"<tr\b[^>]*>.*?</tr>", re.S)
_CELL = re.compile(r"<td\b[^>]*>.*?</td>", re.S)
_CODE = re.compile(r"(<code>)(.*?)(</code>)", re.S)
_UNIT = re.compile(r"<[^>]*>|&[#A-Za-z0-9]+;|.", re.S)  # a tag, an entity, or one character
SEPARATORS = "/.,="


def breakable(code: str) -> str:
    """Code (escaped HTML) as unbreakable pieces with a <wbr> after each separator."""
    out: list[str] = []
    piece: list[str] = []

    def flush(wbr: bool = False) -> None:
        if piece:
            out.append('<span class="seg">' + "".join(piece) + "</span>" + ("<wbr>" if wbr else ""))
            piece.clear()

    for unit in _UNIT.findall(code):
        if unit.startswith("<") or unit.isspace():  # a tag or a space stays between the pieces
            flush()
            out.append(unit)
        else:
            piece.append(unit)
            if unit in SEPARATORS:
                flush(wbr=True)
    flush()
    return "".join(out)


def _cells(row: str) -> str:
    first = True

    def one(cell: re.Match[str]) -> str:
        nonlocal first
        if first:
            first = False
            return cell[0]
        return _CODE.sub(lambda m: m[1] + breakable(m[2]) + m[3], cell[0])

    return _CELL.sub(one, row)


def in_cells(html: str) -> str:
    return _ROW.sub(lambda row: _cells(row[0]), html)


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    return in_cells(html)
