# ruff: noqa: E501
"""Hand-made mutants of report/compare.py: does a compare test fail when one of its claims is broken?

Usage: python scripts/compare_mutants.py [--only NAME ...] [--keep DIR]

Each mutant is one textual change (to report/paired.py, the statistics, or report/compare.py, the pairing
and the rules; report/compare.py held both before issue 68 split it) to a copy of the tracked tree (the checkout is never touched); the
tests are tests/test_compare.py's fast ones (no scripted run), or its command-line ones for the claims
only a command shows (marked "cli"). A mutant is killed when a test fails, survives when they all pass.
cosmic-ray and mutmut were not installed here; these are the defects issue 68 names plus their
neighbours. docs/measurements/2026-12-07-corrected-and-censored.md holds the table.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAIRED, COMPARE = "ncp_local/report/paired.py", "ncp_local/report/compare.py"
FAST = "holm or sign_flip or paired or plays_move or window or followed or order or intervals_carry or holm_adjusts or as_wide"
CLI = "itself or mode_compare_of_two"

# (name, old text, new text, tests)
MUTANTS: tuple[tuple[str, str, str, str], ...] = (
    (
        "pairing: one run's stories rotated",
        "[b[s] for s in stories]]",
        "[b[s] for s in stories[1:] + stories[:1]]]",
        FAST,
    ),
    ("Holm removed", "        compared = _with_holm(compared)", "        pass", FAST),
    ("Holm as Bonferroni", "min(1.0, (m - rank) * p)", "min(1.0, m * p)", FAST),
    (
        "unpaired interval's sign flipped",
        "unpaired.append(measure(take(pool, 1, kb)) - measure(take(pool, 0, ka)))",
        "unpaired.append(measure(take(pool, 0, ka)) - measure(take(pool, 1, kb)))",
        FAST,
    ),
    (
        "paired interval's sign flipped",
        "paired.append(measure(take(pool, 1, ks)) - measure(take(pool, 0, ks)))",
        "paired.append(measure(take(pool, 0, ks)) - measure(take(pool, 1, ks)))",
        FAST,
    ),
    (
        "MDD from the unpaired spread",
        "se = np.std(np.asarray(paired), axis=0, ddof=1)",
        "se = np.std(np.asarray(unpaired), axis=0, ddof=1)",
        FAST,
    ),
    (
        "MDD without the permutation spread",
        "mdd = Z_TEST * spread + Z_POWER * se",
        "mdd = Z_TEST * se + Z_POWER * se",
        FAST,
    ),
    (
        "interval at 50%",
        "p_lo, p_hi = percentile(np.asarray(paired), level)",
        "p_lo, p_hi = percentile(np.asarray(paired), 0.5)",
        FAST,
    ),
    (
        "unpaired at 50%",
        "u_lo, u_hi = percentile(np.asarray(unpaired), level)",
        "u_lo, u_hi = percentile(np.asarray(unpaired), 0.5)",
        FAST,
    ),
    (
        "exact p as if drawn",
        "return np.asarray(far.mean(axis=0), dtype=float), spread",
        "return np.asarray((1 + far.sum(axis=0)) / (1 + len(flips)), dtype=float), spread",
        FAST,
    ),
    (
        "sign-flip observed reversed",
        "    observed = measure(take(pool, 1, every)) - measure(take(pool, 0, every))\n    flips",
        "    observed = measure(take(pool, 0, every)) - measure(take(pool, 1, every))\n    flips",
        FAST,
    ),
    ("censoring rule removed", "    if window[0] != window[1]:", "    if False:", FAST),
    ("censoring read from one run", "    return out[0], out[1]", "    return out[0], out[0]", FAST),
    (
        "withheld p kept in Holm's family",
        "holm([math.nan if d.withheld else d.p for _, d in where])",
        "holm([d.p for _, d in where])",
        FAST,
    ),
    ("figures not reordered", "    rows = tuple(sorted(rows, key=lambda d: d.figure.key in BENT))", "    pass", FAST),
    ("horizon past the data", "        h = known\n", "        pass\n", FAST),
    ("a run compared with itself", "        if same_run(base, other):", "        if False:", CLI),
    (
        "torn result unnamed",
        "for run, name in ((base, a_name), (other, b_name)) for f, why in run.damaged",
        "for run, name in () for f, why in run.damaged",
        CLI,
    ),
)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="*", default=[])
    a = ap.parse_args()
    files = subprocess.run(
        [
            "git",
            "ls-files",
            "ncp_local",
            "tests",
            "pyproject.toml",
            "run.py",
            "conf",
            "prompts",
            "hydra_plugins",
            "specs",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    rows = ["| mutant | tests | result |", "|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for f in files:
            dst = work / f
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, dst)
        sources = {f: (ROOT / f).read_text() for f in (PAIRED, COMPARE)}
        for name, old, new, tests in MUTANTS:
            if a.only and not any(o in name for o in a.only):
                continue
            where = [f for f, text in sources.items() if text.count(old) == 1]
            if len(where) != 1:
                rows.append(f"| {name} | - | not applied: the text is not in one module once |")
                continue
            for f, text in sources.items():
                (work / f).write_text(text.replace(old, new) if f == where[0] else text)
            done = subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-n", "0", "-x", "-p", "no:cacheprovider", "tests/test_compare.py", "-k", tests],
                cwd=work, capture_output=True, text=True, env={"PYTHONPATH": str(work), "PATH": "/usr/bin:/bin", "HOME": tmp, "NCP_BENCH_DATASET": "/work/shared/ncp-bench/dataset"},
            )  # fmt: skip
            failed = [ln.split(" - ")[0].split("::")[-1] for ln in done.stdout.splitlines() if ln.startswith("FAILED")]
            result = f"killed by {failed[0]}" if done.returncode == 1 and failed else (
                "survived" if done.returncode == 0 else f"error (exit {done.returncode})"
            )  # fmt: skip
            rows.append(f"| {name} | {'cli' if tests == CLI else 'fast'} | {result} |")
            print(rows[-1], flush=True)
    print("\n".join(rows))


if __name__ == "__main__":
    main()
