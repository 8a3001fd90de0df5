#!/usr/bin/env bash
# What to run first on a GPU node: does this rig work here, end to end?
#
#   scripts/gpu_acceptance.sh [--cpu] [--models "qwen3 llama3_1_8b"] [--dataset DIR] [--out DIR] [--engine NAME]
#                             [-- PLAN OVERRIDES]
#
# Steps, each logged to OUT/logs/, one summary table at the end (OUT/summary.md):
#   1. mode=plan of the config you mean to run (the overrides after --, e.g.
#      experiment=paper narrator=qwen3 player=qwen3 auditor=qwen3_32b);
#   2. per model (role option in conf/narrator/): its plan, then a short run
#      with that model in every role (2 specs x 3 turns; --cpu: 1 x 1); the
#      first model that runs plays as many specs at once as the config of
#      step 1 will (its `concurrency`), for step 3; a model whose weights are
#      not on this machine is skipped, said so; then its memory: vLLM's own
#      measured figures per engine beside the plan's (OUT/memory.md), which
#      calibrate the plan on this GPU;
#   3. determinism: the first model's run again into another directory, with
#      the same command (engine.deterministic=true for both; an engine then
#      runs at most DETERMINISTIC_MAX_NUM_SEQS sequences at once): results
#      identical at that concurrency (a dataset with fewer specs: warn);
#   4. a short mode=bench on the first model.
# --cpu runs the same steps on the embedded model (vLLM's CPU build), tiny
# sizes (determinism at 1 spec). --engine scripted runs every step without a
# model (the script's own test in CI). Exit status: 0 when no step failed.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PY:-}"
if [[ -z "$PY" ]]; then
    if [[ -x "$ROOT/.venv/bin/python" ]]; then PY="$ROOT/.venv/bin/python"; else PY="python"; fi
fi
CPU=0
MODELS=""
DATASET=""
OUT=""
ENGINE=vllm
PLAN_ARGS=()

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "${BASH_SOURCE[0]}"; }

while [[ $# -gt 0 ]]; do
    case "$1" in
        --cpu) CPU=1 ;;
        --models) MODELS="$2"; shift ;;
        --dataset) DATASET="$2"; shift ;;
        --out) OUT="$2"; shift ;;
        --engine) ENGINE="$2"; shift ;;
        -h|--help) usage; exit 0 ;;
        --) shift; PLAN_ARGS=("$@"); break ;;
        *) echo "error: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done

if [[ $CPU == 1 ]]; then
    MODELS="${MODELS:-smollm2}"; SPECS=1; TURNS=1; BENCH_EPISODES=2; BENCH_TURNS=1
else
    MODELS="${MODELS:-qwen3 llama3_1_8b gemma3_12b mistral_small_24b qwen3_32b}"
    SPECS=2; TURNS=3; BENCH_EPISODES=8; BENCH_TURNS=2
fi
OUT="${OUT:-runs/gpu-acceptance-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT/logs" || exit 2
: >"$OUT/memory.md"
COMMON=(progress=false "engine=$ENGINE")
if [[ -n "$DATASET" ]]; then COMMON+=(dataset=ncp_bench "dataset.path=$DATASET"); fi
# The helpers below import ncp_local from this checkout.
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
# Batch-invariant GPU engines where the rig has the switch (results independent of batch composition).
if [[ $ENGINE == vllm ]] && "$PY" -c 'import sys; from ncp_local.config import VLLMEngineCfg
sys.exit("deterministic" not in VLLMEngineCfg.model_fields)' 2>/dev/null; then
    DET=(engine.deterministic=true)
else
    DET=()
fi

# The `concurrency` (episodes in flight) of the config you mean to run; nothing if it does not compose.
run_concurrency() {
    "$PY" - "$@" 2>/dev/null <<'EOF'
import sys
from omegaconf import OmegaConf
from ncp_local import config
raw = OmegaConf.to_container(config.compose(sys.argv[1:]), resolve=True)
print(config.validate(raw).concurrency)
EOF
}
CONCURRENCY="$(run_concurrency "${COMMON[@]}" "${PLAN_ARGS[@]}")"
CONCURRENCY="${CONCURRENCY:-64}"  # the rig's default when the overrides do not compose (step 1 says why)
CAP="$("$PY" -c 'from ncp_local.engines.settings import DETERMINISTIC_MAX_NUM_SEQS as c; print(c)' 2>/dev/null)"
# Determinism is checked with as many episodes in flight as the run will have
# (what breaks batch invariance is many sequences at once); --cpu: 1, to stay short.
if [[ $CPU == 1 ]]; then
    DET_SIZE=(limit=$SPECS max_turns=$TURNS); DET_SPECS=$SPECS
else
    DET_SIZE=(limit=$CONCURRENCY "concurrency=$CONCURRENCY" max_turns=$TURNS); DET_SPECS=$CONCURRENCY
fi

ROWS=()
FAILED=0
row() {  # step, model, status, seconds, detail
    ROWS+=("| $1 | $2 | $3 | $4 | $5 |")
    [[ "$3" == "fail" ]] && FAILED=1
    echo "[acceptance] $1 ${2}: $3 ($4 s) $5" >&2
}

# Runs one command, its output in OUT/logs/NAME.log; sets RC and SECS.
step() {
    local name="$1"; shift
    local started=$SECONDS
    "$@" >"$OUT/logs/$name.log" 2>&1
    RC=$?
    SECS=$((SECONDS - started))
}

last_line() { grep -v '^\s*$' "$1" | tail -n 1 | cut -c1-160; }

# 1. The plan of the config you mean to run.
step plan "$PY" "$ROOT/run.py" mode=plan "${COMMON[@]}" "${PLAN_ARGS[@]}"
case $RC in
    0) row plan "${PLAN_ARGS[*]:-(defaults)}" go "$SECS" "$(last_line "$OUT/logs/plan.log")" ;;
    1) row plan "${PLAN_ARGS[*]:-(defaults)}" warn "$SECS" "$(last_line "$OUT/logs/plan.log")" ;;
    *) row plan "${PLAN_ARGS[*]:-(defaults)}" fail "$SECS" "$(last_line "$OUT/logs/plan.log")" ;;
esac

# Episodes and terminations of a run directory, and whether any ended invalid.
summarise() {
    "$PY" - "$1" <<'EOF'
import collections, json, pathlib, sys
results = sorted(pathlib.Path(sys.argv[1], "results").glob("*.json"))
ends = collections.Counter(json.loads(p.read_text())["termination"] for p in results)
print(f"{len(results)} episodes: " + ", ".join(f"{k} {v}" for k, v in sorted(ends.items())))
sys.exit(3 if ends.get("invalid") else 0)
EOF
}

# The same results in two run directories (each episode's record, its seal aside).
# Exit 3 when identical but fewer episodes than the third argument (the dataset had fewer specs).
same_results() {
    "$PY" - "$1" "$2" "$3" <<'EOF'
import json, pathlib, sys
def load(d):
    out = {}
    for p in sorted(pathlib.Path(d, "results").glob("*.json")):
        rec = json.loads(p.read_text())
        rec.pop("seal", None)  # names the run directory's own bookkeeping
        out[p.name] = rec
    return out
a, b = load(sys.argv[1]), load(sys.argv[2])
differ = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
if not a:
    print("no results to compare"); sys.exit(1)
if differ:
    print(f"{len(differ)} of {len(a)} episodes differ: {', '.join(differ[:5])}"); sys.exit(1)
wanted = int(sys.argv[3])
print(f"{len(a)} episodes identical" + (f" (only {len(a)} in flight of the {wanted} wanted)" if len(a) < wanted else ""))
sys.exit(3 if len(a) < wanted else 0)
EOF
}

# Memory per engine: vLLM's own start-up figures in a run's log beside the plan's for
# the same config; one row per engine appended to the table (4th argument), one line
# out. Exit 0 measured and the KV as planned (within 5%), 3 measured KV below the
# plan's, 4 nothing measured (scripted engine, or no memory line from vLLM).
memory() {
    "$PY" - "$@" <<'EOF'
import re, sys

plan_log, run_log, model, table = sys.argv[1:5]
NUM = r"(-?[\d.]+)"
GIB = " GiB"


def _assumption(text):
    """'3 GiB per GPU beyond ... (plan.overhead_gib) ...' -> '3 GiB (plan.overhead_gib)'."""
    m = re.match(r"\s*([\d.]+ GiB)[^(]*\(([^)]+)\)", text)
    return f"{m.group(1)} ({m.group(2)})" if m else text.strip()[:60]


def plan_engines(text):
    """The plan's engine blocks (ncp_local/plan): 'engine N: NAME for ROLES; ... share S' and the lines below."""
    engines = []
    for block in re.split(r"(?m)^(?=engine \d+: )", text)[1:]:
        def find(pattern, cast=float, default=None):
            m = re.search(pattern, block)
            return cast(m.group(1).replace(",", "")) if m else default
        engines.append({
            "name": re.match(r"engine \d+: (\S+)", block).group(1),
            "tp": find(r"tensor_parallel_size (\d+)", int, 1),
            "share": find(rf"share {NUM}"),
            "weights": find(rf"weights {NUM} GiB"),
            "kv": find(rf"KV capacity {NUM} GiB"),
            "kv_tokens": find(r"KV capacity [^=\n]*= ([\d,]+) tokens", int),
            "assumed": "; ".join(_assumption(a) for a in re.findall(r"assumed: ([^\n]*)", block)),
        })
    return engines


# vLLM's own lines. Per GPU worker (0.33, v1/worker/gpu_worker.py): "Free memory on device
# (F/T GiB) on startup. Desired GPU memory utilization is (U, R GiB). Actual usage is A GiB for
# consumed memory (weights + non-torch), P GiB for peak activation, and G GiB for CUDAGraph
# memory. ... Current kv cache memory in use is K GiB." Per CPU worker (v1/worker/cpu_worker.py):
# "Explicitly|Auto set (K/T) GiB for KV cache on node N[, with R GiB requested memory for the
# worker. C GiB memory was consumed by non-kv usages.]". Per engine: "... KV cache size: N tokens".
GPU = re.compile(rf"Free memory on device \({NUM}/{NUM} GiB\) on startup\. Desired GPU memory utilization is "
                 rf"\({NUM}, {NUM} GiB\)\. Actual usage is {NUM} GiB for consumed memory \(weights \+ non-torch\), "
                 rf"{NUM} GiB for peak activation, and {NUM} GiB for CUDAGraph memory\..*?"
                 rf"Current kv cache memory in use is {NUM} GiB")
CPU = re.compile(rf"(?:Explicitly|Auto) set \({NUM}/{NUM}\) GiB for KV cache on node \d+"
                 rf"(?:, with {NUM} GiB requested memory for the worker\. {NUM} GiB memory was consumed)?")
TOKENS = re.compile(r"KV cache size: ([\d,]+) tokens")
LOAD = re.compile(rf"Model loading took {NUM} GiB")


def measured(path):
    """Per worker, per engine and per load, in start order (engines start one at a time, in the plan's order)."""
    workers, tokens, loads = [], [], []
    for line in open(path, errors="replace"):
        if m := GPU.search(line):
            f = [float(x) for x in m.groups()]
            workers.append({"total": f[1], "requested": f[3], "consumed": f[4], "activation": f[5],
                            "graphs": f[6], "kv": f[7], "peak": f[4] + f[5] + f[6] + f[7], "gpu": True})
        elif m := CPU.search(line):
            kv, total, requested, consumed = (None if x is None else float(x) for x in m.groups())
            workers.append({"total": total, "requested": requested, "consumed": consumed, "activation": None,
                            "graphs": None, "kv": kv, "peak": None if consumed is None else consumed + kv,
                            "gpu": False})
        elif m := TOKENS.search(line):
            tokens.append(int(m.group(1).replace(",", "")))
        elif m := LOAD.search(line):
            loads.append(float(m.group(1)))
    return workers, tokens, loads


def show(x, unit=GIB):
    if x is None:
        return "-"
    return f"{x:,}" if isinstance(x, int) else f"{x:.2f}{unit}"


def pick(ws, key, how=max):
    """One figure for an engine across its GPUs (tensor parallel): the fullest GPU, the smallest KV."""
    vals = [w[key] for w in ws if w[key] is not None]
    return how(vals) if vals else None


engines = plan_engines(open(plan_log, errors="replace").read())
workers, tokens, loads = measured(run_log)
if not engines or not workers:
    print(f"no engine in the plan ({plan_log})" if not engines else f"no vLLM memory line in {run_log}")
    sys.exit(4)
rows, lines, short = [], [], False
for i, e in enumerate(engines):
    ws, workers = workers[:e["tp"]], workers[e["tp"]:]
    load, loads = loads[:e["tp"]], loads[e["tp"]:]
    if not ws:
        lines.append(f"{e['name']}: not measured")
        continue
    tok = tokens[i] if i < len(tokens) else None
    total = pick(ws, "total")
    # vLLM requests the share of the device (the CPU build: of the NUMA node's RAM) for the
    # whole engine: weights, activations, CUDA graphs and the KV cache.
    planned = e["share"] * total if e["share"] is not None and total is not None else None
    kv, peak = pick(ws, "kv", min), pick(ws, "peak")
    for w in ws:
        w["other"] = None if w["peak"] is None else w["peak"] - w["kv"]
    # What is not KV cache: the plan's weights + assumed overhead; vLLM's consumed + activation peak + graphs.
    other_plan = planned - e["kv"] if planned is not None and e["kv"] is not None else None
    other = pick(ws, "other")
    ratio = tok / e["kv_tokens"] if tok and e["kv_tokens"] else (kv / e["kv"] if kv is not None and e["kv"] else None)
    short |= ratio is not None and ratio < 0.95
    pair = lambda a, b, unit=GIB: f"{show(a, unit)} / {show(b, unit)}"
    rows.append("| " + " | ".join([
        model, e["name"], str(e["tp"]), show(e["share"], ""), pair(planned, pick(ws, "requested")),
        pair(e["weights"], sum(load) if load else None), pair(other_plan, other), e["assumed"] or "-",
        show(pick(ws, "activation")), show(pick(ws, "graphs")), pair(e["kv"], kv), pair(e["kv_tokens"], tok),
        "-" if ratio is None else f"{ratio:.2f}", show(peak)]) + " |")
    lines.append(f"{e['name']}: planned {show(planned) if planned is not None else 'share ' + show(e['share'], '')}"
                 f" (not KV {show(other_plan)}, KV {show(e['kv_tokens'])} tok), measured {show(peak)}"
                 f" (not KV {show(other)}, KV {show(tok)} tok" + ("" if ratio is None else f": {ratio:.2f} of plan") + ")")
with open(table, "a") as out:
    if not open(table).read():
        columns = ["run", "engine", "tp", "share", "GiB per GPU: planned (share x GPU) / vLLM requested",
                   "weights (all GPUs): plan / loaded", "not KV per GPU: plan (planned - KV) / measured (consumed + activation + graphs)",
                   "assumed (plan)", "activation peak", "CUDA graphs", "KV GiB per GPU: plan / measured",
                   "KV tokens: plan / measured", "KV measured / planned", "measured peak per GPU (not KV + KV)"]
        out.write("| " + " | ".join(columns) + " |\n|" + "---|" * len(columns) + "\n")
    out.write("".join(r + "\n" for r in rows))
print("; ".join(lines) + f" ({table})")
sys.exit(3 if short else 0)
EOF
}

FIRST=""
for m in $MODELS; do
    roles=(narrator="$m" player="$m" auditor="$m")
    # Until a model has run, the next to run is the first: it runs at step 3's size.
    if [[ -z "$FIRST" ]]; then size=("${DET_SIZE[@]}"); else size=(limit=$SPECS max_turns=$TURNS); fi
    step "plan-$m" "$PY" "$ROOT/run.py" mode=plan "${COMMON[@]}" "${roles[@]}" "${size[@]}"
    if grep -q "weights not found at" "$OUT/logs/plan-$m.log"; then
        row run "$m" skip "$SECS" "$(grep -o 'weights not found at [^)]*' "$OUT/logs/plan-$m.log" | head -n 1)"
        continue
    fi
    if [[ $RC -ge 2 ]]; then
        row plan "$m" fail "$SECS" "$(last_line "$OUT/logs/plan-$m.log")"
        continue
    fi
    row plan "$m" "$([[ $RC == 0 ]] && echo go || echo warn)" "$SECS" "$(last_line "$OUT/logs/plan-$m.log")"
    step "run-$m" "$PY" "$ROOT/run.py" "${COMMON[@]}" "${DET[@]}" "${roles[@]}" "${size[@]}" "out_dir=$OUT/$m/a"
    if [[ $RC != 0 ]]; then
        row run "$m" fail "$SECS" "exit $RC: $(last_line "$OUT/logs/run-$m.log")"
        continue
    fi
    detail="$(summarise "$OUT/$m/a")"
    status=$?
    row run "$m" "$([[ $status == 0 ]] && echo ok || echo warn)" "$SECS" "$detail"
    # What vLLM reserved beside what the plan said (the same overrides, so the same plan); vLLM's
    # own lines are in the run directory's engine.log (the terminal log holds the rig's lines).
    detail="$(memory "$OUT/logs/plan-$m.log" "$OUT/$m/a/engine.log" "$m" "$OUT/memory.md")"
    case $? in
        0) row memory "$m" ok 0 "$detail" ;;
        3) row memory "$m" warn 0 "$detail: the plan promised more KV than vLLM gave" ;;
        *) row memory "$m" n/a 0 "$detail" ;;
    esac
    [[ -z "$FIRST" ]] && FIRST="$m"
done

if [[ -n "$FIRST" ]]; then
    m="$FIRST"
    # 3. The same command again (another directory, or it would resume the finished run).
    step "again-$m" "$PY" "$ROOT/run.py" "${COMMON[@]}" "${DET[@]}" narrator="$m" player="$m" auditor="$m" \
        "${DET_SIZE[@]}" "out_dir=$OUT/$m/b"
    if [[ $RC != 0 ]]; then
        row determinism "$m" fail "$SECS" "exit $RC: $(last_line "$OUT/logs/again-$m.log")"
    else
        detail="$(same_results "$OUT/$m/a" "$OUT/$m/b" "$DET_SPECS")"
        status=$?
        how="run concurrency $CONCURRENCY${DET:+, ${DET[*]}: at most ${CAP:-?} sequences at once per engine}"
        case $status in
            0) row determinism "$m" ok "$SECS" "$detail ($how)" ;;
            3) row determinism "$m" warn "$SECS" "$detail ($how): pass --dataset DIR with $DET_SPECS specs or more" ;;
            *) row determinism "$m" fail "$SECS" "$detail ($how)" ;;
        esac
    fi
    # 4. A short bench on the same model.
    step "bench-$m" "$PY" "$ROOT/run.py" mode=bench "${COMMON[@]}" narrator="$m" player="$m" auditor="$m" \
        bench.episodes=$BENCH_EPISODES bench.turns=$BENCH_TURNS bench.sequential=false
    if [[ $RC == 0 ]]; then
        row bench "$m" ok "$SECS" "$(grep '^ratios:' "$OUT/logs/bench-$m.log" | tail -n 1)"
    else
        row bench "$m" fail "$SECS" "exit $RC: $(last_line "$OUT/logs/bench-$m.log")"
    fi
else
    row determinism - fail 0 "no model ran (weights missing or every plan failed)"
fi

[[ -s "$OUT/memory.md" ]] || echo "no memory measured (no vLLM engine ran: see the memory rows of summary.md)" >"$OUT/memory.md"
{
    echo "| step | model | status | seconds | detail |"
    echo "|---|---|---|---:|---|"
    printf '%s\n' "${ROWS[@]}"
    echo
    echo "logs: $OUT/logs/ (memory per engine, measured beside planned: $OUT/memory.md)"
} | tee "$OUT/summary.md"
exit $FAILED
