"""`mode=submission` then `mode=validate`: an archive of scripted runs on the official dataset; its flags are
computed (the official prompt files give `verified: true`, the rig's own prompts `false` and why); editing
one metric, one result file, one prompt hash, or dropping or swapping a story fails validation with one
line naming it (exit 2); a truncated archive and runs that cannot be submitted are refused the same way."""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from cli_runner import run_cli
from ncp_local.protocol.prompts import OFFICIAL_SHA256
from ncp_local.report.submission import read_archive


@pytest.fixture(scope="module")
def official_prompt_run(
    official_dataset: Path, official_prompts: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    out = tmp_path_factory.mktemp("official-prompts") / "run"
    done = run_cli(
        "engine=scripted",
        "dataset=ncp_bench",
        f"dataset.path={official_dataset}",
        f"prompts.dir={official_prompts}",
        "max_turns=5",
        f"out_dir={out}",
        "progress=false",
    )
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture(scope="module")
def archive(official_prompt_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("submission") / "sub.tar.gz"
    res = run_cli("mode=submission", f"runs=[{official_prompt_run}]", f"submission={out}", "report.resamples=200")
    assert res.returncode == 0, res.stderr
    assert "official_prompts=true, official_dataset=true, complete=true, verified=true" in res.stdout
    return out


def _rewrite(src: Path, dst: Path, change: Callable[[dict[str, bytes]], None]) -> Path:
    members = read_archive(src)
    change(members)
    with tarfile.open(dst, "w:gz") as tar:
        for name, data in sorted(members.items()):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return dst


def _one_error(path: Path) -> str:
    res = run_cli("mode=validate", f"submission={path}")
    assert res.returncode == 2, res.stdout + res.stderr
    [line] = res.stderr.strip().splitlines()
    assert line.startswith("error: ")
    return line


def _index(members: dict[str, bytes]) -> dict:
    return json.loads(members["submission.json"])


def _set_index(members: dict[str, bytes], data: dict) -> None:
    members["submission.json"] = json.dumps(data).encode()


def test_validate_passes_and_the_archive_holds_what_it_claims(archive: Path, official_prompt_run: Path) -> None:
    res = run_cli("mode=validate", f"submission={archive}")
    assert res.returncode == 0, res.stderr
    assert "verified: true" in res.stdout
    members = read_archive(archive)
    sub = _index(members)
    [entry] = sub["runs"]
    assert len(entry["results"]) == 100 == entry["dataset"]["stories"]
    assert entry["metrics"]["episodes"] == 100
    assert set(entry["metrics"]["avg_turns"]) == {"point", "lo", "hi"}
    assert len(entry["survival"]["s"]) == 5 + 1
    assert set(entry["models"]) == {"narrator", "player", "auditor"}
    assert entry["prompts"]["narrate.txt"] == OFFICIAL_SHA256["narrate"]
    manifest = json.loads((official_prompt_run / "manifest.json").read_text())
    assert entry["identity"] == manifest["identity"]
    assert (
        members[f"runs/{entry['key']}/results/movie52.json"]
        == (official_prompt_run / "results/movie52.json").read_bytes()
    )


def test_rig_prompts_are_not_verified_and_say_why(scripted_official_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "rig.tar.gz"
    res = run_cli("mode=submission", f"runs=[{scripted_official_run}]", f"submission={out}", "report.resamples=50")
    assert res.returncode == 0, res.stderr
    assert "official_prompts=false, official_dataset=true, complete=true, verified=false" in res.stdout
    assert "official_prompts: opening.txt is not the official file" in res.stdout
    sub = _index(read_archive(out))
    assert sub["flags"]["verified"] is False and sub["why_not"][0].startswith(f"{scripted_official_run.name}: ")
    assert run_cli("mode=validate", f"submission={out}").returncode == 0


def test_an_edited_metric_is_named(archive: Path, tmp_path: Path) -> None:
    def change(m: dict[str, bytes]) -> None:
        sub = _index(m)
        sub["runs"][0]["metrics"]["avg_turns"]["point"] += 0.5
        _set_index(m, sub)

    line = _one_error(_rewrite(archive, tmp_path / "t.tar.gz", change))
    assert "submission.json" in line and "runs.0.metrics.avg_turns.point" in line and "recomputed" in line


def test_an_edited_result_file_is_named(archive: Path, tmp_path: Path) -> None:
    def change(m: dict[str, bytes]) -> None:
        [name] = [n for n in m if n.endswith("/results/movie52.json")]
        data = json.loads(m[name])
        data["turns"][0]["response"] += " And then a dragon."
        m[name] = json.dumps(data).encode()

    line = _one_error(_rewrite(archive, tmp_path / "t.tar.gz", change))
    assert "results/movie52.json" in line and "edited" in line


def test_an_edited_result_with_its_listing_fails_on_its_seal(archive: Path, tmp_path: Path) -> None:
    def change(m: dict[str, bytes]) -> None:
        import hashlib

        [name] = [n for n in m if n.endswith("/results/movie52.json")]
        data = json.loads(m[name])
        data["termination"] = "all_resolved" if data["termination"] != "all_resolved" else "max_turns"
        m[name] = json.dumps(data).encode()
        sub = _index(m)
        sub["runs"][0]["results"]["movie52"] = hashlib.sha256(m[name]).hexdigest()
        _set_index(m, sub)

    line = _one_error(_rewrite(archive, tmp_path / "t.tar.gz", change))
    assert "results/movie52.json" in line and "does not match its seal" in line


def test_an_edited_prompt_hash_is_named(archive: Path, tmp_path: Path) -> None:
    def in_index(m: dict[str, bytes]) -> None:
        sub = _index(m)
        sub["runs"][0]["prompts"]["narrate.txt"] = "0" * 64
        _set_index(m, sub)

    line = _one_error(_rewrite(archive, tmp_path / "a.tar.gz", in_index))
    assert "runs.0.prompts.narrate.txt" in line

    def in_manifest(m: dict[str, bytes]) -> None:
        [name] = [n for n in m if n.endswith("/manifest.json")]
        manifest = json.loads(m[name])
        manifest["identity_parts"]["prompts"]["narrate.txt"] = "0" * 64
        m[name] = json.dumps(manifest).encode()

    line = _one_error(_rewrite(archive, tmp_path / "b.tar.gz", in_manifest))
    assert "manifest.json" in line and "narrate.txt" in line


def test_a_missing_or_swapped_story_is_named(archive: Path, scripted_official_run: Path, tmp_path: Path) -> None:
    def drop(m: dict[str, bytes]) -> None:
        [name] = [n for n in m if n.endswith("/results/movie52.json")]
        del m[name]

    line = _one_error(_rewrite(archive, tmp_path / "a.tar.gz", drop))
    assert "movie52" in line and "missing" in line

    def swap(m: dict[str, bytes]) -> None:
        [name] = [n for n in m if n.endswith("/results/movie52.json")]
        m[name] = (scripted_official_run / "results/movie52.json").read_bytes()

    line = _one_error(_rewrite(archive, tmp_path / "b.tar.gz", swap))
    assert "results/movie52.json" in line


def test_a_truncated_archive_is_one_line(archive: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut.tar.gz"
    data = archive.read_bytes()
    cut.write_bytes(data[: len(data) // 2])
    line = _one_error(cut)
    assert str(cut) in line and "truncated or damaged" in line
    res = run_cli("mode=validate")
    assert res.returncode == 2 and "submission" in res.stderr.strip()


def test_runs_that_cannot_be_submitted_write_nothing(official_prompt_run: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "movie00.json").write_text(json.dumps({"episode": {"id": "movie00"}}))
    official = tmp_path / "official"
    res = run_cli("mode=export", "export.format=reference", f"runs=[{official_prompt_run}]", f"export.out={official}")
    assert res.returncode == 0, res.stderr
    for folder, said in ((other, "movie00.json"), (official / official_prompt_run.name, "carry no seals")):
        out = tmp_path / "sub.tar.gz"
        res = run_cli("mode=submission", f"runs=[{folder}]", f"submission={out}")
        assert res.returncode == 2
        [line] = res.stderr.strip().splitlines()
        assert said in line
        assert not out.exists()
