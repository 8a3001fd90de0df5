"""Every report column is defined once (report/glossary.py): the documentation's column tables are
generated from it (scripts/gen_reference.py, on docs/reference/columns.md), the HTML report shows it as
the headers' tooltips; a run of one episode shows no interval."""

from __future__ import annotations

import csv
import html
import io
import json
import re
from pathlib import Path

import yaml

from helpers import Scripted, make_spec, spec_doc
from ncp_local.report import build_report
from ncp_local.report.cost import COST_COLUMNS
from ncp_local.report.endings import SUMMARY_HEADER as ENDINGS_HEADER
from ncp_local.report.glossary import COST_GLOSSARY, ENDINGS_GLOSSARY, GLOSSARY, define, plain
from ncp_local.report.runs import attach_specs, load_run
from ncp_local.report.tables import METRICS
from test_docs import gen

ROOT = Path(__file__).resolve().parent.parent


def _rows(markdown: str, code: bool) -> list[tuple[str, str]]:
    """A generated table's rows as text again (the generator escapes Markdown's specials)."""
    pattern = r"^\| `([^`]+)` \| (.+) \|$" if code else r"^\| ([^|`]+) \| (.+) \|$"
    rows = re.findall(pattern, markdown, re.M)
    return [(c, gen.uncell(d)) for c, d in rows if (c, d) not in (("column", "meaning"), ("---", "---"))]


def test_the_docs_define_every_column_as_the_code_does() -> None:
    page = (ROOT / "docs" / "reference" / "columns.md").read_text(encoding="utf-8")
    assert "<!-- gen:columns -->" in page and "<!-- gen:cost-columns -->" in page
    assert _rows(gen.generate("columns"), code=True) == list(GLOSSARY)


def test_the_docs_define_every_cost_column_as_the_code_does() -> None:
    assert _rows(gen.generate("cost-columns"), code=False) == list(COST_GLOSSARY)
    # every column the cost table can show has its one definition, and nothing else is defined
    assert sorted(h for _, h in COST_COLUMNS) == sorted(h for h, _ in COST_GLOSSARY)


def test_the_docs_define_every_endings_column_as_the_code_does() -> None:
    assert _rows(gen.generate("endings-columns"), code=True) == list(ENDINGS_GLOSSARY)
    # the endings table's every header has its definition; only the turn bands share one
    assert [h for h, _ in ENDINGS_GLOSSARY if h != "turns band"] == list(ENDINGS_HEADER)


def _run(root: Path, ids: list[str]) -> Path:
    dataset = root / "dataset"
    (dataset / "specs").mkdir(parents=True)
    (dataset / "index.yaml").write_text(yaml.safe_dump({"specs": ids}))
    for sid in ids:
        (dataset / "specs" / f"{sid}.yaml").write_text(yaml.safe_dump(spec_doc(sid), sort_keys=False))
    run = root / "run"
    Scripted(run, [make_spec(s) for s in ids], max_turns=2).run()
    manifest = json.loads((run / "manifest.json").read_text())
    manifest.update(
        {"dataset": {"path": str(dataset), "specs": ids}, "config": {"engine": {"name": "scripted"}, "max_turns": 2}}
    )
    (run / "manifest.json").write_text(json.dumps(manifest))
    return run


def test_tooltips_and_no_interval_for_one_episode(tmp_path: Path) -> None:
    one, two = _run(tmp_path / "one", ["solo"]), _run(tmp_path / "two", ["x", "y"])
    runs = [load_run(one), load_run(two)]
    for r in runs:
        attach_specs(r)
    out = tmp_path / "report"
    rep = build_report(runs, out, resamples=200)
    index = (out / "index.html").read_text()
    summary = index[index.index("<table class='summary'>") :]
    summary = summary[: summary.index("</table>")]
    for _, header, _ in METRICS:
        assert f'title="{html.escape(plain(define(header)), quote=True)}">{html.escape(header)}</th>' in summary
    for term in ("conflict", "max_turns", "context_limit", "invalid"):
        assert f'<span title="{html.escape(plain(define(term)), quote=True)}">{term}</span>' in summary
    body = summary[summary.index("<tbody>") :]
    first, second = body.split("</tr>")[:2]
    assert "[" not in first and second.count("[") == len(METRICS) + 1  # every metric and conflict-free
    lines = [ln for ln in rep["summary_md"].splitlines() if ln.startswith("| ") and "---" not in ln][1:]
    assert "[" not in lines[0] and "[" in lines[1]
    rows = list(csv.DictReader(io.StringIO((out / "results.csv").read_text())))
    assert rows[0]["avg_turns_lo"] == "" and rows[1]["avg_turns_lo"] != ""
    assert rows[1]["conflict_free"] == "2" and rows[1]["avg_turns"] == "2"  # integers printed as integers
    assert "Per genre, an episode counts once under each genre of its spec" in (out / "genres.md").read_text()
