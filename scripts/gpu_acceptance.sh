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
#      with that model in every role (2 specs x 3 turns; --cpu: 1 x 1);
#      a model whose weights are not on this machine is skipped, said so;
#   3. determinism: the first model's run again into another directory, with
#      the same command (engine.deterministic=true for both): results identical;
#   4. a short mode=bench on the first model.
# --cpu runs the same steps on the embedded model (vLLM's CPU build), tiny
# sizes. --engine scripted runs every step without a model (the script's own
# test in CI). Exit status: 0 when no step failed.
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

usage() { sed -n '2,18p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

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
COMMON=(progress=false "engine=$ENGINE")
if [[ -n "$DATASET" ]]; then COMMON+=(dataset=ncp_bench "dataset.path=$DATASET"); fi
# Batch-invariant GPU engines where the rig has the switch (results independent of batch composition).
if [[ $ENGINE == vllm ]] && "$PY" -c 'import sys; from ncp_local.config import VLLMEngineCfg
sys.exit("deterministic" not in VLLMEngineCfg.model_fields)' 2>/dev/null; then
    DET=(engine.deterministic=true)
else
    DET=()
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
same_results() {
    "$PY" - "$1" "$2" <<'EOF'
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
print(f"{len(a)} episodes identical")
EOF
}

FIRST=""
for m in $MODELS; do
    roles=(narrator="$m" player="$m" auditor="$m")
    size=(limit=$SPECS max_turns=$TURNS)
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
    [[ -z "$FIRST" ]] && FIRST="$m"
done

if [[ -n "$FIRST" ]]; then
    m="$FIRST"
    # 3. The same command again (another directory, or it would resume the finished run).
    step "again-$m" "$PY" "$ROOT/run.py" "${COMMON[@]}" "${DET[@]}" narrator="$m" player="$m" auditor="$m" \
        limit=$SPECS max_turns=$TURNS "out_dir=$OUT/$m/b"
    if [[ $RC != 0 ]]; then
        row determinism "$m" fail "$SECS" "exit $RC: $(last_line "$OUT/logs/again-$m.log")"
    else
        detail="$(same_results "$OUT/$m/a" "$OUT/$m/b")"
        status=$?
        row determinism "$m" "$([[ $status == 0 ]] && echo ok || echo fail)" "$SECS" "$detail${DET:+ (${DET[*]})}"
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

{
    echo "| step | model | status | seconds | detail |"
    echo "|---|---|---|---:|---|"
    printf '%s\n' "${ROWS[@]}"
    echo
    echo "logs: $OUT/logs/"
} | tee "$OUT/summary.md"
exit $FAILED
