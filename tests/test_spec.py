"""PROTOCOL section 1: loading, validation and lint of the official format."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import yaml

from cli_runner import run_cli
from ncp_local.errors import InputError
from ncp_local.protocol.spec import dataset_summary, load_dataset, load_spec

ROOT = Path(__file__).resolve().parent.parent


def test_official_release_counts(official_dataset: Path) -> None:
    ds = load_dataset(official_dataset)
    specs = {s.id: s for s in ds.specs}
    assert len(ds.specs) == 100
    assert [s.id for s in ds.specs[:3]] == ["movie48", "movie09", "movie72"]
    assert sum(len(s.initial_facts) for s in ds.specs) == 1660
    assert sum(len(s.commitments) for s in ds.specs) == 1222
    assert sum(len(s.trajectory) for s in ds.specs) == 1511
    types = Counter(c.type for s in ds.specs for c in s.commitments)
    assert types == {"ordering": 583, "invariant": 397, "achievement": 242}
    assert all(any(c.type == "achievement" for c in s.commitments) for s in ds.specs)
    assert all(len(s.meta.genres) == 2 for s in ds.specs)
    assert len({g for s in ds.specs for g in s.meta.genres}) == 21
    for sid, (f, c, n) in {"movie52": (16, 12, 13), "movie00": (14, 20, 20)}.items():
        s = specs[sid]
        assert (len(s.initial_facts), len(s.commitments), len(s.trajectory)) == (f, c, n)
    assert min(len(s.initial_facts) for s in ds.specs) == 8 and max(len(s.initial_facts) for s in ds.specs) == 31
    negated = [w for w in ds.warnings if "negated" in w.field]
    assert len(negated) == 2 and all("movie93" in w.file for w in negated)
    assert dataset_summary(ds).startswith("specs=100 facts=1660 commitments=1222 nodes=1511")


def test_our_specs_load_clean() -> None:
    ds = load_dataset(ROOT / "specs")
    assert len(ds.specs) >= 3
    assert ds.warnings == ()
    for s in ds.specs:
        assert len(s.meta.genres) == 2
        assert any(c.type == "achievement" for c in s.commitments)


def _good() -> dict:
    return {
        "meta": {"id": "x", "title": "T", "genres": ["a", "b"], "player_role": "someone"},
        "synopsis": "text",
        "initial_facts": [{"id": "f_0", "content": "a fact", "negated": False}],
        "commitments": [
            {
                "id": "c_0",
                "type": "achievement",
                "description": "d",
                "satisfaction_condition": "s",
                "violation_condition": "v",
            }
        ],
        "trajectory": [{"id": "s_0", "description": "d", "trigger_event": "t", "key_delta": "k"}],
    }


def _mutate(path: str, value: object) -> dict:
    doc = _good()
    *parents, last = path.split(".")
    node: object = doc
    for p in parents:
        node = node[int(p)] if isinstance(node, list) else node[p]  # type: ignore[index]
    if value is KeyError:
        del node[last]  # type: ignore[arg-type]
    elif isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value  # type: ignore[index]
    return doc


BAD = [
    ("missing meta.title", _mutate("meta.title", KeyError), "meta.title", "missing"),
    ("blank content", _mutate("initial_facts.0.content", "   "), "initial_facts[0].content", "empty"),
    ("wrong type", _mutate("initial_facts.0.negated", "yes"), "initial_facts[0].negated", "true or false"),
    ("list expected", _mutate("commitments", {"c_0": 1}), "commitments", "expected a list"),
    ("unknown commitment type", _mutate("commitments.0.type", "goal"), "commitments[0].type", "not one of"),
    ("path-like id", _mutate("trajectory.0.id", "../s_0"), "trajectory[0].id", "plain id"),
    ("dot id", _mutate("initial_facts.0.id", ".."), "initial_facts[0].id", "plain id"),
    ("65-character id", _mutate("commitments.0.id", "c" * 65), "commitments[0].id", "plain id"),
    ("id like an option", _mutate("trajectory.0.id", "-s_0"), "trajectory[0].id", "plain id"),
    ("space in id", _mutate("initial_facts.0.id", "f 0"), "initial_facts[0].id", "plain id"),
    ("empty trajectory", _mutate("trajectory", []), "trajectory", "empty"),
    ("stem mismatch", _mutate("meta.id", "y"), "meta.id", "file stem"),
    ("missing section", _mutate("synopsis", KeyError), "synopsis", "missing"),
]


@pytest.mark.parametrize("name,doc,field,needle", BAD, ids=[b[0] for b in BAD])
def test_bad_spec_names_file_and_field(tmp_path: Path, name: str, doc: dict, field: str, needle: str) -> None:
    path = tmp_path / "x.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(InputError) as err:
        load_spec(path)
    assert err.value.field == field
    assert needle in err.value.message
    assert str(path) in str(err.value)


def test_duplicate_ids_and_yaml_errors(tmp_path: Path) -> None:
    doc = _good()
    doc["initial_facts"].append({"id": "f_0", "content": "again"})
    (tmp_path / "x.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(InputError, match=r"initial_facts\[1\]\.id: duplicate id 'f_0'"):
        load_spec(tmp_path / "x.yaml")
    (tmp_path / "x.yaml").write_text("meta: [unclosed\n")
    with pytest.raises(InputError, match="invalid YAML") as err:
        load_spec(tmp_path / "x.yaml")
    assert err.value.field.startswith("line ")


def test_lint_warns_on_missing_node_reference(tmp_path: Path) -> None:
    doc = _good()
    doc["commitments"][0]["description"] = "s_0 must precede s_7"
    (tmp_path / "specs").mkdir()
    (tmp_path / "specs" / "x.yaml").write_text(yaml.safe_dump(doc))
    (tmp_path / "index.yaml").write_text("specs: [x]\n")
    ds = load_dataset(tmp_path)
    assert len(ds.warnings) == 1 and "s_7" in ds.warnings[0].message and "s_0" not in ds.warnings[0].message


def test_index_errors(tmp_path: Path) -> None:
    (tmp_path / "specs").mkdir()
    (tmp_path / "index.yaml").write_text("specs: [a, a]\n")
    (tmp_path / "specs" / "a.yaml").write_text(yaml.safe_dump({**_good(), "meta": {**_good()["meta"], "id": "a"}}))
    with pytest.raises(InputError, match=r"specs\[1\]: duplicate"):
        load_dataset(tmp_path)
    (tmp_path / "index.yaml").write_text("specs: [a, b]\n")
    with pytest.raises(InputError, match=r"specs\[1\]: 'b' has no file"):
        load_dataset(tmp_path)


def test_cli_malformed_spec_one_line_exit_2(tmp_path: Path) -> None:
    (tmp_path / "specs").mkdir()
    (tmp_path / "index.yaml").write_text("specs: [x]\n")
    (tmp_path / "specs" / "x.yaml").write_text(yaml.safe_dump(_mutate("commitments.0.type", "goal")))
    proc = run_cli("mode=lint", f"dataset.path={tmp_path}", cwd=tmp_path)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "x.yaml: commitments[0].type:" in lines[0]


def test_cli_lint_official(official_dataset: Path, tmp_path: Path) -> None:
    proc = run_cli("mode=lint", "dataset=ncp_bench", f"dataset.path={official_dataset}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert any(line.startswith("specs=100 facts=1660 commitments=1222 nodes=1511") for line in proc.stdout.splitlines())
    assert proc.stdout.count("movie93.yaml: initial_facts[") == 2


def test_yaml_limits_are_bounds_not_bans(tmp_path: Path) -> None:
    """Nesting up to the bound and repeated values (not keys) still load; one level more does not."""
    from ncp_local.protocol.spec import MAX_YAML_DEPTH, parse_yaml

    # Every node counts: the top mapping, the lists, the scalar at the bottom.
    assert parse_yaml("a: " + "[" * (MAX_YAML_DEPTH - 2) + "1" + "]" * (MAX_YAML_DEPTH - 2)) is not None
    assert parse_yaml("a: x\nb: x\nc: {d: x, e: x}\n") == {"a": "x", "b": "x", "c": {"d": "x", "e": "x"}}
    with pytest.raises(yaml.YAMLError, match="nested deeper"):
        parse_yaml("a: " + "[" * (MAX_YAML_DEPTH - 1) + "1" + "]" * (MAX_YAML_DEPTH - 1))
    with pytest.raises(yaml.YAMLError, match="duplicate key 'b'"):
        parse_yaml("a:\n  b: 1\n  b: 2\n")
