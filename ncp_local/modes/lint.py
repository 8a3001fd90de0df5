"""`mode=lint`: check a dataset (`dataset.path=DIR`) and print its counts and warnings."""

from __future__ import annotations

from ..config import RunConfig, dataset_path
from ..protocol.spec import dataset_summary, load_dataset


def main(cfg: RunConfig) -> int:
    ds = load_dataset(dataset_path(cfg))
    for w in ds.warnings:
        print(w)
    print(dataset_summary(ds))
    return 0
