"""The documentation site builds without a warning, and its generated reference holds to the code.

`mkdocs build --strict` (mkdocs.yml: a broken link, a page missing from the nav or a link to an
unknown anchor is an error) runs on a copy of the repository's docs in a temporary folder, so the
build never writes into the tree. The reference pages' sections are generated before it builds
(scripts/gen_reference.py --site, mkdocs.yml's docs_dir); the tests below hold the generator to conf/ and to
ncp_local/exits.py.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _generator():
    spec = importlib.util.spec_from_file_location("gen_reference", ROOT / "scripts" / "gen_reference.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


gen = _generator()


def test_every_config_key_has_a_description() -> None:
    """A key added to conf/ needs a comment beside it or right above it (the configuration reference
    shows that comment)."""
    missing = gen.undocumented()
    assert not missing, "conf/ keys with no description: " + ", ".join(f"{k.path} ({k.file})" for k in missing)


def test_an_undocumented_key_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conf = tmp_path / "conf"
    shutil.copytree(ROOT / "conf", conf)
    with (conf / "config.yaml").open("a", encoding="utf-8") as f:
        f.write("brand_new_key: 3\n")
    monkeypatch.setattr(gen, "CONF", conf)
    monkeypatch.setattr(gen, "ROOT", tmp_path)
    assert [k.path for k in gen.undocumented()] == ["brand_new_key"]
    with pytest.raises(ValueError, match="brand_new_key"):
        gen.gen_config()


def test_the_config_reference_lists_every_key_the_files_set() -> None:
    page = gen.gen_config()
    for key in gen.documented():
        assert f"| `{key}` |" in page, key
    # a key no file sets, which the validator accepts, is listed too
    assert "| `<role>.model.data_parallel_size` |" in page and "| `engine.extra_body` |" in page


def test_every_exit_code_has_its_troubleshooting_section() -> None:
    text = (ROOT / "docs" / "guide" / "troubleshooting.md").read_text(encoding="utf-8")
    headings = set(re.findall(r"^## Exit (\d+)(?: and (\d+))?$", text, re.MULTILINE))
    documented = {c for pair in headings for c in pair if c}
    codes = {code for code, _, _ in gen.exit_codes()}
    assert codes == documented, (codes, documented)


def test_every_marker_names_a_section() -> None:
    for page in (ROOT / "docs").rglob("*.md"):
        for name in gen.MARKER.findall(page.read_text(encoding="utf-8")):
            assert name in gen.SECTIONS, f"{page}: unknown generated section {name!r}"


def build_site(tmp_path: Path) -> Path:
    """The site built strict from a copy of the docs into `tmp_path/site` (skips without mkdocs)."""
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent)) or shutil.which("mkdocs")
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None or not mkdocs:
        pytest.skip("mkdocs and mkdocs-material are not installed (the `docs` extra; `make install` installs it)")
    tree = tmp_path / "tree"
    tree.mkdir()
    shutil.copy2(ROOT / "mkdocs.yml", tree / "mkdocs.yml")
    (tree / "scripts").mkdir()
    shutil.copy2(ROOT / "scripts" / "site_hooks.py", tree / "scripts" / "site_hooks.py")  # mkdocs.yml's hook
    # As `make docs`: the pages with their sections generated, where mkdocs.yml's docs_dir says.
    gen.write_site(tree / "build" / "docs")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run(
        [mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=tree,
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "WARNING" not in proc.stderr, proc.stderr[-4000:]
    return tmp_path / "site"


def test_the_site_builds_strict(tmp_path: Path) -> None:
    site = build_site(tmp_path)
    config = (site / "reference" / "configuration.html").read_text(encoding="utf-8")
    assert "gen:config" not in config and "thinking_budget" in config
    assert "Unreleased" in (site / "changelog.html").read_text(encoding="utf-8")
    # The README's everyday commands, the one list, shown on the first-run page.
    first_run = (site / "guide" / "first-run.html").read_text(encoding="utf-8")
    assert "gen:everyday" not in first_run and "multirun/seeds" in first_run


def test_the_pages_are_generated_before_the_build(tmp_path: Path) -> None:
    """The builder makes no content of ours (Zensical runs no MkDocs hook): mkdocs.yml builds the copy
    `gen_reference.py --site` writes, with every section generated and the changelog in place. The one
    hook left only shapes code in table cells (scripts/site_hooks.py), which a builder may ignore."""
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert re.search(r"^docs_dir: build/docs$", config, re.M) and not re.search(r"^plugins:", config, re.M)
    hooks = re.search(r"^hooks:\n((?:  - .*\n)+)", config, re.M)
    assert hooks is None or hooks.group(1).split() == ["-", "scripts/site_hooks.py"], hooks
    out = tmp_path / "docs"
    assert gen.write_site(out) >= 7
    pages = {p.relative_to(out) for p in out.rglob("*.md")}
    assert pages == {p.relative_to(ROOT / "docs") for p in (ROOT / "docs").rglob("*.md")}
    assert not [p for p in pages if gen.MARKER.search((out / p).read_text(encoding="utf-8"))]
    assert (out / "changelog.md").read_text(encoding="utf-8") == (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")


def test_an_unknown_section_writes_nothing(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    shutil.copytree(ROOT / "docs", docs)
    (docs / "index.md").write_text("# Home\n\n<!-- gen:no-such-section -->\n", encoding="utf-8")
    with pytest.raises(ValueError, match="index.md: unknown generated section 'no-such-section'"):
        gen.write_site(tmp_path / "out", docs)
    assert not (tmp_path / "out").exists()
