"""rundir/seals.py's writer: a sealed record's bytes are json.dumps's (indent 1, non-ASCII as it is), which
results have been since they were first compared byte for byte, though pydantic_core now writes them."""

from __future__ import annotations

import json
import random
import struct
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic_core import to_json

from ncp_local.protocol.records import EpisodeResult
from ncp_local.rundir.seals import _NOT_AS_PYTHON, SEAL, check_file, pretty_json, sealed_json

ROOT = Path(__file__).resolve().parent.parent
WRITTEN = sorted((ROOT / "tests" / "data").rglob("results/*.json"))  # results written by older rigs

# Characters whose writing differs between encoders, if anywhere: controls, quotes, backslash, DEL,
# separators JavaScript treats as line ends, non-ASCII of every width, and text shaped like numbers.
ALPHABET = [*map(chr, range(0x20)), '"', "\\", "/", "\x7f", "\u2028", "\u2029", "é", "中", "\U0001f600", "\ufeff"]
ALPHABET += ["a", " ", "0", "1", ".", "e", "-", "+", ",", "\n", "0.0000", "e-5,", "e-5\n", "NaN", "Infinity"]


def _bits(rng: random.Random) -> float:
    return float(struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0])


def _floats(rng: random.Random, n: int) -> list[float]:
    """Every kind of double: from random bits (any exponent), and near each power of ten, where the
    switch between decimal and exponent forms lies."""
    out = [_bits(rng) for _ in range(n)]
    out += [float(f"{m!r}e{e}") for e in range(-330, 310) for m in (1.0, 1.5, 9.999999999999998, rng.random())]
    return out + [0.0, -0.0, float("nan"), float("inf"), float("-inf"), 5e-324, sys.float_info.max]


def _text(rng: random.Random) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(rng.randrange(0, 40)))


def _value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(8 if depth < 3 else 5)
    if kind == 0:
        return _text(rng)
    if kind == 1:
        return rng.choice([0, -1, 2**63, -(2**70), rng.randrange(-(10**6), 10**6)])
    if kind == 2:
        return rng.choice([True, False, None])
    if kind in (3, 4):
        return _bits(rng) if kind == 3 else rng.random() * 10.0 ** rng.randrange(-12, 20)
    if kind == 5:
        return [_value(rng, depth + 1) for _ in range(rng.randrange(0, 4))]
    return {_text(rng): _value(rng, depth + 1) for _ in range(rng.randrange(0, 4))}


def _fast_path_agrees(data: dict[str, Any]) -> bool:
    """pydantic_core's bytes are json.dumps's, or the check sends `data` to json.dumps; True: they are
    (tested apart from pretty_json, which is then not right only by its fallback)."""
    fast = to_json(data, indent=1, inf_nan_mode="constants")
    same = fast.decode() == json.dumps(data, indent=1, ensure_ascii=False)
    assert same or any(form.search(fast) for form in _NOT_AS_PYTHON), data
    assert pretty_json(data) == json.dumps(data, indent=1, ensure_ascii=False).encode(), data
    return same


def test_floats_are_written_as_json_dumps_writes_them() -> None:
    floats = _floats(random.Random(67), 50_000)
    assert pretty_json({"x": floats}) == json.dumps({"x": floats}, indent=1, ensure_ascii=False).encode()
    otherwise = sum(not _fast_path_agrees(data) for x in floats for data in ({"x": x}, {"x": [x, 1]}))
    assert otherwise, "pydantic_core now writes every float as json.dumps does: the check may go"


def test_strings_keys_and_nesting_are_written_as_json_dumps_writes_them() -> None:
    rng = random.Random(69)
    cases = [{_text(rng): _value(rng) for _ in range(rng.randrange(0, 6))} for _ in range(3000)]
    assert sum(_fast_path_agrees(data) for data in cases) > len(cases) // 2


def test_a_lone_surrogate_fails_the_write_as_before() -> None:
    # pydantic_core refuses it; json.dumps keeps it, and its UTF-8 encoding fails, as the write always has.
    with pytest.raises(UnicodeEncodeError):
        pretty_json({"t": "a\ud800b"})


@pytest.mark.parametrize("path", WRITTEN, ids=lambda p: p.stem)
def test_results_written_by_older_rigs_are_sealed_again_byte_for_byte(path: Path) -> None:
    data = json.loads(path.read_bytes())
    seal = data.pop(SEAL)
    result = EpisodeResult.model_validate(data)
    again = sealed_json(result, seal["spec_sha256"], seal["run"])
    assert again == path.read_bytes()
    assert check_file(path, EpisodeResult, seal["run"])[1] == ""
