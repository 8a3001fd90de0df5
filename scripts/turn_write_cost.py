"""What committing one turn costs the rig at turn 1, 25, 50 and 100, checkpoint format 1 beside format 2.

Format 1 (fceb218): the whole checkpoint sealed (`sealed_json`) and written by `atomic_write` (temp file,
fsync, rename) on the event loop, every turn. Format 2: the turn's line (`turn_log.turn_line`) made on the
loop and handed to the run directory's writer thread, which appends and fsyncs. Texts as long as a real
narrator's and player's (`--response-chars`, `--input-chars`; defaults about 2.6x the scripted engine's).

    .venv/bin/python scripts/turn_write_cost.py [--turns 100] [--repeat 5] [--fsync-delay-s 0.02]

Prints, per turn: format 1's CPU and wall (what the loop waited), format 2's CPU on the loop and wall
until written, and the writer's CPU per line; each the minimum over `--repeat` episodes.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from ncp_local.protocol.ledger import EpisodeState, Exchange, FactEntry, FactUpdate
from ncp_local.protocol.records import (
    Checkpoint,
    ConflictCheckRecord,
    ConflictCounts,
    FactUpdateRecord,
    StatusRecord,
    TrajectoryRecord,
    TurnRecord,
)
from ncp_local.rundir import atomic
from ncp_local.rundir.seals import sealed_json
from ncp_local.rundir.store import RunDir

MARKS = (1, 25, 50, 100)


def _text(n: int, seed: int) -> str:
    words = ("the", "lantern", "gate", "whispered", "across", "moor", "Holmes", "said", "quietly", "ledger")
    out, i = [], seed
    while sum(len(w) + 1 for w in out) < n:
        out.append(words[i % len(words)])
        i = i * 7 + 3
    return " ".join(out)[:n]


def episode(turns: int, response_chars: int, input_chars: int) -> list[Checkpoint]:
    """The checkpoints of one synthetic episode: after its opening, then after each turn (two facts
    added a turn, a trajectory and a status check with reasons, as the scripted engine answers)."""
    facts = tuple(FactEntry(id=f"f_{i}", text=_text(80, i), active=True) for i in range(12))
    state = EpisodeState(
        facts=facts, node_occurred=(False,) * 6, statuses=(("c1", "pending"), ("c2", "pending")), pending=FactUpdate()
    )
    state = state.model_copy(update={"opening": _text(response_chars, 1)})
    zero = ConflictCounts(fact=0, commitment=0, player_input=0, total=0)
    cps = [Checkpoint(spec_id="s", state=state, opening_update=None, turns=(), narrator_state={})]
    records: list[TurnRecord] = []
    for t in range(turns):
        rec = TurnRecord.model_validate(
            {
                "turn": t,
                "player_input": _text(input_chars, t + 2),
                "response": _text(response_chars, t + 3),
                "fact_update": FactUpdateRecord(
                    add_facts=(_text(90, t), _text(70, t + 1)), negate_facts=(), reason=_text(160, t)
                ),
                "conflict_check": ConflictCheckRecord(conflicts=(), counts=zero),
                "double_check": None,
                "conflicts": (),
                "trajectory_check": TrajectoryRecord.model_validate(
                    {
                        "trigger": {"occurred": False, "reason": _text(150, t)},
                        "delta": {"occurred": False, "reason": _text(150, t + 9)},
                    }
                ),
                "status_check": (
                    StatusRecord(id="c1", status="PENDING", reason=_text(140, t)),
                    StatusRecord(id="c2", status="PENDING", reason=_text(140, t + 5)),
                ),
            }
        )
        records.append(rec)
        n = len(state.facts)
        new = (
            FactEntry(id=f"f_{n}", text=_text(90, t), active=True),
            FactEntry(id=f"f_{n + 1}", text=_text(70, t + 1), active=True),
        )
        state = state.model_copy(
            update={
                "facts": state.facts + new,
                "exchanges": state.exchanges + (Exchange(player_input=rec.player_input, response=rec.response),),
            }
        )
        cps.append(cps[0].model_copy(update={"state": state, "turns": tuple(records)}))
    return cps


def measure(cps: list[Checkpoint], root: Path) -> dict[str, dict[int, float]]:
    out: dict[str, dict[int, float]] = {
        k: {} for k in ("f1_cpu", "f1_wall", "f2_cpu", "f2_wall", "line_bytes", "f1_bytes")
    }
    old = root / "old.json"
    for k, cp in enumerate(cps[1:], start=1):
        c0, w0 = time.process_time(), time.perf_counter()
        text = sealed_json(cp, "", "run")
        atomic.atomic_write(old, text)
        out["f1_cpu"][k], out["f1_wall"][k] = time.process_time() - c0, time.perf_counter() - w0
        out["f1_bytes"][k] = len(text)
    store = RunDir(root / "run")
    store.open({"bench": True}, "run")
    store.write_checkpoint(cps[0]).result()
    for k, cp in enumerate(cps[1:], start=1):
        c0, w0 = time.thread_time(), time.perf_counter()
        done = store.write_checkpoint(cp)  # what the loop does
        out["f2_cpu"][k] = time.thread_time() - c0
        done.result()
        out["f2_wall"][k] = time.perf_counter() - w0
    store.close()
    log = (root / "run" / "checkpoints" / "s.jsonl").read_bytes().splitlines()
    for k in range(1, len(cps)):
        out["line_bytes"][k] = len(log[k]) + 1
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--response-chars", type=int, default=4000)
    ap.add_argument("--input-chars", type=int, default=700)
    ap.add_argument("--fsync-delay-s", type=float, default=0.0, help="added to every fsync (a slow filesystem)")
    args = ap.parse_args()
    cps = episode(args.turns, args.response_chars, args.input_chars)
    runs = []
    with atomic.fsync_delay(args.fsync_delay_s):
        for _ in range(args.repeat):
            with tempfile.TemporaryDirectory(dir=".") as tmp:
                runs.append(measure(cps, Path(tmp)))
    best = {key: {k: min(r[key][k] for r in runs) for k in runs[0][key]} for key in runs[0]}
    marks = [m for m in MARKS if m <= args.turns]
    print(f"per committed turn, min of {args.repeat} episodes; fsync delay {args.fsync_delay_s * 1000:.0f} ms")
    print(
        "| turn | format 1 bytes | format 1 CPU ms | format 1 wall ms "
        "| format 2 bytes | format 2 loop CPU ms | format 2 wall ms (written) |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for m in marks:
        print(
            f"| {m} | {best['f1_bytes'][m]:.0f} | {best['f1_cpu'][m] * 1e3:.2f} | {best['f1_wall'][m] * 1e3:.2f} | "
            f"{best['line_bytes'][m]:.0f} | {best['f2_cpu'][m] * 1e3:.3f} | {best['f2_wall'][m] * 1e3:.2f} |"
        )
    last, first = marks[-1], marks[0]
    print(
        f"turn {last} / turn {first}: format 1 CPU x{best['f1_cpu'][last] / best['f1_cpu'][first]:.2f}, "
        f"format 2 loop CPU x{best['f2_cpu'][last] / best['f2_cpu'][first]:.2f}, "
        f"format 2 bytes x{best['line_bytes'][last] / best['line_bytes'][first]:.2f}"
    )


if __name__ == "__main__":
    main()
