"""An mkdocs hook (mkdocs.yml `hooks:`): code in a table's cells may break only after a separator.

The site's CSS keeps code in table cells from breaking inside a word (docs/stylesheets/extra.css); this
puts a `<wbr>` after each `/`, `.`, `,` and `=` of such code, so a long path or default
(`${oc.env:NCP_MODELS_ROOT,/models}`) still wraps, at a separator and never inside a name. A `<wbr>`
adds no character: copying the cell gives the code as written.
"""

from __future__ import annotations

import re
from typing import Any

_CELL = re.compile(r"<td\b[^>]*>.*?</td>", re.S)
_CODE = re.compile(r"(<code>)(.*?)(</code>)", re.S)
_TAG_OR_ENTITY = re.compile(r"(<[^>]*>|&[#A-Za-z0-9]+;)")
_AFTER = re.compile(r"([/.,=])(?=.)", re.S)


def breakable(code: str) -> str:
    """Code text (escaped HTML) with a <wbr> after each separator, tags and entities left whole."""
    parts = _TAG_OR_ENTITY.split(code)
    return "".join(p if _TAG_OR_ENTITY.fullmatch(p) else _AFTER.sub(r"\1<wbr>", p) for p in parts)


def in_cells(html: str) -> str:
    return _CELL.sub(lambda cell: _CODE.sub(lambda m: m[1] + breakable(m[2]) + m[3], cell[0]), html)


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    return in_cells(html)
