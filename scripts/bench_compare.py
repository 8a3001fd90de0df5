"""The same `mode=bench` on an older commit and on this tree, alternately, on this machine and venv.

Usage: python scripts/bench_compare.py OLD_COMMIT [hydra overrides...] [--repeats N]

e.g. `python scripts/bench_compare.py 880ff79 bench.episodes=8 bench.turns=3`. The old commit
is checked out into a temporary git worktree (removed at the end, also on Ctrl-C or an error;
nothing of this checkout changes); this tree is the one the script sits in, uncommitted changes
included. The bench runs old, new, old, new, ... (`--repeats` each, default 2) with this Python,
so a machine that gets busier or quieter meanwhile hits both alike. Each run's figures are read
from its `bench.json` (mode=bench writes one since issue 42); an older tree that writes none is
read from its printed table and `ratios:` line. Prints both trees' tables, each figure's median
and spread, and the median of the paired ratios of the rig's wall time new/old.

Bad input (an unknown commit, a commit whose tree has no mode=bench): one line on stderr, exit 2,
before anything is checked out. A bench run that fails: its command and exit code, exit 1.
Run it before merging anything that touches `ncp_local/execution/` or `ncp_local/engines/`
(docs/performance.md).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ncp_local.bench.figures import FILE as BENCH_JSON  # noqa: E402
from ncp_local.bench.figures import BenchFigures, spread  # noqa: E402
from ncp_local.exits import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK, EXIT_SIGNAL  # noqa: E402

# Where a tree keeps its bench: the layered tree's mode module, or the flat module before it.
BENCH_MODULES = ("ncp_local/modes/bench.py", "ncp_local/bench.py")
# The figures compared, from each run: (label, how to read it from a parsed run).
FIGURES = (
    ("rig wall s", ("wall", "a")),
    ("ceiling wall s", ("wall", "c")),
    ("replay_k wall s", ("wall", "d")),
    ("sequential wall s", ("wall", "b")),
    ("rig total tok/s", ("tok_s", "a")),
    ("rig/ceiling", ("ratio", "rig/ceiling")),
    ("rig/replay_k", ("ratio", "rig/replay_k")),
    ("rig/sequential", ("ratio", "rig/sequential")),
    ("cache_hit", ("ratio", "cache_hit")),
    ("overhead ms/call", ("overhead", "a")),
)


class BadInput(Exception):
    """Refused before anything ran: one line, exit 2."""


def git(*args: str, cwd: Path = ROOT, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc


def resolve(commit: str) -> str:
    """The full hash of `commit`, if it names a commit whose tree has mode=bench; BadInput otherwise."""
    if not commit or commit.startswith("-"):
        raise BadInput(f"bench_compare: {commit!r} is not a commit")
    found = git("rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}", check=False)
    if found.returncode != 0 or not found.stdout.strip():
        raise BadInput(f"bench_compare: unknown commit {commit!r} (not in {ROOT})")
    full = found.stdout.strip()
    if not has_bench(full):
        raise BadInput(
            f"bench_compare: commit {commit} ({full[:12]}) has no mode=bench "
            f"(neither {' nor '.join(BENCH_MODULES)} with a bench section in conf/config.yaml)"
        )
    return full


def has_bench(commit: str) -> bool:
    config = git("show", f"{commit}:conf/config.yaml", check=False)
    if config.returncode != 0 or not re.search(r"^bench:", config.stdout, re.MULTILINE):
        return False
    return any(git("cat-file", "-e", f"{commit}:{path}", check=False).returncode == 0 for path in BENCH_MODULES)


# ---- reading one run's figures ------------------------------------------------------------


def _num(text: str) -> float | None:
    try:
        value = float(text.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) else None  # `nan`: not measured


def parse_printed(stdout: str) -> dict[str, Any]:
    """A run's figures from its printed table and `ratios:` line (trees that write no bench.json)."""
    ways: dict[str, dict[str, Any]] = {}
    ratios: dict[str, float | None] = {}
    for line in stdout.splitlines():
        if line.startswith("| ") and not line.startswith("| way "):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) < 9 or not cells[0][:2].strip():
                continue
            key = cells[0].split(" ", 1)[0]
            ways[key] = {
                "name": cells[0],
                "wall_s": _num(cells[1]),
                "calls": _num(cells[2]),
                "total_tok_s": _num(cells[6]),
                "overhead_ms": _num(cells[8]),
            }
        elif line.startswith("ratios: "):
            for item in line[len("ratios: ") :].split():
                name, _, value = item.partition("=")
                ratios[name] = _num(value)
    if "a" not in ways or not ratios:
        raise ValueError("no bench table or ratios line in the output")
    return {"ways": ways, "ratios": ratios, "table": _table(stdout), "source": "printed table"}


def _table(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.startswith("|")]


def read_json(path: Path) -> dict[str, Any]:
    """A run's figures from its bench.json (the same shape `parse_printed` gives)."""
    fig = BenchFigures.read(path)
    ways = {
        w.key: {
            "name": w.name,
            "wall_s": w.wall_s,
            "calls": w.calls,
            "total_tok_s": w.total_tok_s,
            "overhead_ms": w.overhead_ms,
        }
        for w in fig.ways
    }
    table = [line for chunk in fig.lines for line in chunk.splitlines() if line.startswith("|")]
    return {
        "ways": ways,
        "ratios": dict(fig.ratios),
        "table": table,
        "source": BENCH_JSON,
        "commit": fig.commit,
        "machine": fig.machine.model_dump(),
        "vllm": fig.vllm,
        "workload": fig.workload.model_dump(),
    }


def figure(run: dict[str, Any], how: tuple[str, str]) -> float | None:
    kind, key = how
    if kind == "ratio":
        return run["ratios"].get(key)
    way = run["ways"].get(key)
    if way is None:
        return None
    return {"wall": way["wall_s"], "tok_s": way["total_tok_s"], "overhead": way["overhead_ms"]}[kind]


def summary(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> dict[str, Any]:
    """Per figure, both trees' spreads; and the rig's wall time new/old, pair by pair (run i of each)."""
    out: dict[str, Any] = {"figures": {}}
    for label, how in FIGURES:
        out["figures"][label] = {
            "old": spread([figure(r, how) for r in old]),
            "new": spread([figure(r, how) for r in new]),
        }
    pairs = [
        figure(n, ("wall", "a")) / figure(o, ("wall", "a"))  # type: ignore[operator]
        for o, n in zip(old, new, strict=False)
        if figure(o, ("wall", "a")) and figure(n, ("wall", "a"))
    ]
    out["rig_wall_new_over_old"] = {"pairs": pairs, "median": statistics.median(pairs) if pairs else None}
    return out


def _fmt(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _range(s: dict[str, Any]) -> str:
    return f"{_fmt(s['min'])}-{_fmt(s['max'])}" if s["n"] else "-"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def report(old_commit: str, new_label: str, old: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[str]:
    lines: list[str] = []
    for tree, label, runs in (("old", old_commit, old), ("new", new_label, new)):
        for i, run in enumerate(runs, 1):
            lines.append(f"{tree} ({label}) run {i} of {len(runs)} (figures from its {run['source']}):")
            lines.extend(run["table"])
            lines.append("ratios: " + " ".join(f"{k}={_fmt(v)}" for k, v in run["ratios"].items()))
            lines.append("")
    s = summary(old, new)
    lines.append("| figure | old median | old min-max | old spread | new median | new min-max | new spread |")
    lines.append("|---|---:|---:|---:|---:|---:|---:|")
    for label, both in s["figures"].items():
        o, n = both["old"], both["new"]
        if not o["n"] and not n["n"]:
            continue
        lines.append(
            f"| {label} | {_fmt(o['median'])} | {_range(o)} | {_pct(o['spread'])} | {_fmt(n['median'])} | "
            f"{_range(n)} | {_pct(n['spread'])} |"
        )
    r = s["rig_wall_new_over_old"]
    lines.append(
        f"rig wall new/old: median={_fmt(r['median'], 3)} over {len(r['pairs'])} pairs "
        f"({', '.join(_fmt(p, 3) for p in r['pairs'])})"
    )
    return lines


# ---- running ------------------------------------------------------------------------------


class Interrupted(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise(signum: int, frame: Any) -> None:
    raise Interrupted(signum)


def run_bench(tree: Path, overrides: list[str], out_dir: Path, workdir: Path) -> dict[str, Any]:
    """One mode=bench on `tree` with this Python; its figures (bench.json, else its printed lines)."""
    cmd = [sys.executable, str(tree / "run.py"), "mode=bench", *overrides, f"out_dir={out_dir}"]
    print(f"bench_compare: {' '.join(cmd)}", file=sys.stderr, flush=True)
    env = {**os.environ, "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(cmd, cwd=workdir, stdout=subprocess.PIPE, text=True, env=env)
    try:
        stdout, _ = proc.communicate()
    except BaseException:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        raise
    if proc.returncode != 0:
        raise RuntimeError(f"bench failed (exit {proc.returncode}): {' '.join(cmd)}")
    if (out_dir / BENCH_JSON).is_file():
        try:
            return read_json(out_dir / BENCH_JSON)
        except ValueError:  # another format of the record (pydantic's ValidationError is one): the table
            pass
    return parse_printed(stdout)


def compare(old_commit: str, overrides: list[str], repeats: int) -> list[str]:
    full = resolve(old_commit)
    tmp = Path(tempfile.mkdtemp(prefix="ncp-bench-compare-"))
    old_tree = tmp / "old"
    added = False
    try:
        git("worktree", "add", "--detach", str(old_tree), full)
        added = True
        old: list[dict[str, Any]] = []
        new: list[dict[str, Any]] = []
        for i in range(repeats):
            for tree, runs, name in ((old_tree, old, "old"), (ROOT, new, "new")):
                runs.append(run_bench(tree, overrides, tmp / f"{name}-{i + 1}", tmp))
        dirty = git("status", "--porcelain", check=False).stdout.strip()
        head = git("rev-parse", "--short", "HEAD").stdout.strip()
        return report(old_commit, f"{head}{' + uncommitted changes' if dirty else ''}", old, new)
    finally:
        if added:
            git("worktree", "remove", "--force", str(old_tree), check=False)
        git("worktree", "prune", check=False)
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("commit", help="the older commit (hash, tag or branch)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for both trees' mode=bench")
    parser.add_argument("--repeats", type=int, default=2, help="runs per tree, alternating (default 2)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        print(f"bench_compare: --repeats must be at least 1, got {args.repeats}", file=sys.stderr)
        return EXIT_BAD_INPUT
    bad = [o for o in args.overrides if o.split("=", 1)[0].lstrip("+~") in ("mode", "out_dir")]
    if bad:
        print(f"bench_compare: {bad[0]!r}: mode and out_dir are the script's own", file=sys.stderr)
        return EXIT_BAD_INPUT
    previous = signal.signal(signal.SIGTERM, _raise)
    try:
        lines = compare(args.commit, args.overrides, args.repeats)
    except BadInput as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_BAD_INPUT
    except RuntimeError as exc:
        print(f"bench_compare: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("bench_compare: interrupted; the temporary worktree is removed", file=sys.stderr)
        return EXIT_SIGNAL["SIGINT"]
    except Interrupted as exc:
        print(f"bench_compare: {exc}; the temporary worktree is removed", file=sys.stderr)
        return EXIT_SIGNAL.get(str(exc), EXIT_FAILED)
    finally:
        signal.signal(signal.SIGTERM, previous)
    for line in lines:
        print(line)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
