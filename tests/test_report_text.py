"""The report's text in HTML: the rig's prose with its code spans rendered, and labels shortened where
space is short (the browser tier checks how they look: tests/test_report_browser.py)."""

from __future__ import annotations

from ncp_local.report.html_parts import label_text, prose
from ncp_local.report.labels import SHORT, shortened


def test_prose_renders_code_spans_and_escapes_everything() -> None:
    assert prose("`max_turns` and `context_limit` censored") == (
        "<code>max_turns</code> and <code>context_limit</code> censored"
    )
    # Escaped inside and outside a span; a backtick without its pair stays as written.
    assert prose("a <b> `x<y>` & `z") == "a &lt;b&gt; <code>x&lt;y&gt;</code> &amp; `z"
    assert prose("no spans") == "no spans"


def test_a_long_label_is_shortened_and_kept_whole_on_hover() -> None:
    long = "narrator.temperature=0.35 player.temperature=0.9 auditor.temperature=0.1 seed=7 narrator.top_p=0.9"
    short = shortened(long)
    assert len(short) <= SHORT and short.startswith("n.temperature=0.35 p.temperature=0.9 a.temperature=0.1")
    assert shortened("qwen3-8b / qwen3-32b / adversarial / baseline") == "qwen3-8b / qwen3-32b / adversarial / baseline"
    assert shortened("x" * 100).endswith("\u2026") and len(shortened("x" * 100)) == SHORT
    cell = label_text(long)
    assert f'title="{long}"' in cell and f">{short}<" in cell.replace("<wbr>", "")
    # A narrow column breaks a setting after `_` or `=`, never inside a value first.
    assert label_text("context_limit_share=0.3") == "context_<wbr>limit_<wbr>share=<wbr>0.3"
    assert label_text("a <b>") == "a &lt;b&gt;"  # short enough: as it is, escaped
