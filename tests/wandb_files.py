"""Reading W&B's offline run files (`run-<id>.wandb`) back, for the tracker tests.

wandb 0.31 writes them from its Go core and ships no Python reader, so this is one, after the format
the files have: a 7-byte header (`:W&B`, a 2-byte magic, a version byte), then LevelDB's log format
(32 KiB blocks; each chunk a 4-byte checksum, a 2-byte little-endian length, a type: 1 whole, 2 first,
3 middle, 4 last; a block's tail shorter than a chunk header is padding), each record a serialized
`wandb.proto.wandb_internal_pb2.Record`.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

HEADER = 7
BLOCK = 32 * 1024
CHUNK_HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list[Any]:
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", f"{path}: not a W&B run file"
    out, pos, pending = [], HEADER, b""
    while pos + CHUNK_HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < CHUNK_HEADER:
            pos += left  # padding at the end of a block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + CHUNK_HEADER])
        if length == 0 and kind == 0:
            pos += left  # a zeroed block tail
            continue
        body = data[pos + CHUNK_HEADER : pos + CHUNK_HEADER + length]
        pos += CHUNK_HEADER + length
        if kind == FULL:
            pending = body
        elif kind == FIRST:
            pending = body
            continue
        elif kind == MIDDLE:
            pending += body
            continue
        else:
            pending += body
        rec = pb.Record()
        rec.ParseFromString(pending)
        out.append(rec)
        pending = b""
    return out


def _key(item: Any) -> str:
    return item.key or "/".join(item.nested_key)


def summary(paths: list[Path]) -> dict[str, Any]:
    """The run's summary as the files leave it: every summary update, in order, over its files."""
    out: dict[str, Any] = {}
    for path in paths:
        for rec in records(path):
            if rec.WhichOneof("record_type") == "summary":
                for item in rec.summary.update:
                    out[_key(item)] = json.loads(item.value_json)
    return out


def runs(paths: list[Path]) -> list[Any]:
    """The run records (id, group, name) of the files."""
    return [rec.run for path in paths for rec in records(path) if rec.WhichOneof("record_type") == "run"]
