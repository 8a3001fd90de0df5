#!/usr/bin/env bash
# Every kind of run the rig plays, into OUT, so two trees' results can be compared byte for byte
# (issue 59: a restructure must leave every result as it was):
#
#   scripts/identical_results.sh OUT            # from the repository to measure
#   diff -r OUT_BEFORE/<case>/results OUT_AFTER/<case>/results   (scripts/identical_results.sh --compare A B)
#
# Cases: demo (make demo's run, the embedded model), trials (scripted, the 100 official stories,
# trials.count=2), sweep-batched and sweep-basic (4 scripted points), shards (3 shards merged),
# sigterm-run and sigterm-sweep (SIGTERM halfway, then the same command again: must equal the
# uninterrupted run). Only results/ is compared: the call log and manifest carry times and hosts.
set -euo pipefail
REPO=$(pwd)
PY=${PY:-$REPO/.venv/bin/python}
DATASET=${NCP_BENCH_DATASET:-$(cd .. && pwd)/shared/ncp-bench/dataset}

if [[ ${1:-} == --compare ]]; then
  a=$2 b=$3 status=0
  for d in "$a"/*/; do
    case=$(basename "$d")
    while IFS= read -r res; do
      rel=${res#"$a"/}
      if diff -r -q "$res" "$b/$rel" >/dev/null; then
        echo "identical: $rel ($(find "$res" -type f | wc -l) files)"
      else
        echo "DIFFERENT: $rel"; status=1
      fi
    done < <(find "$a/$case" -type d -name results | sort)
  done
  exit $status
fi

OUT=$(realpath -m "$1")
mkdir -p "$OUT"
CASES=${CASES:-demo trials sweep shards sigterm-run sigterm-sweep}  # a subset: CASES="shards sigterm-run"
log() { echo "== $*" >&2; }
want() { [[ " $CASES " == *" $1 "* ]]; }

want demo && { log demo
$PY run.py out_dir="$OUT/demo" progress=false > "$OUT/demo.log" 2>&1; }

want trials && { log trials
$PY run.py engine=scripted dataset=ncp_bench dataset.path="$DATASET" trials.count=2 max_turns=12 \
  out_dir="$OUT/trials" progress=false > "$OUT/trials.log" 2>&1; }

want sweep && for launcher in batched basic; do
  log "sweep-$launcher"
  # A sweep's points write runs/<dataset>-<key> under the working directory: one per case.
  mkdir -p "$OUT/sweep-$launcher" && (cd "$OUT/sweep-$launcher" && $PY "$REPO/run.py" -m hydra/launcher=$launcher \
    engine=scripted max_turns=6 seed=0,1 narrator.temperature=0.2,0.6 hydra.sweep.dir=sweep progress=false \
    > "$OUT/sweep-$launcher.log" 2>&1)
done

want shards && { log shards
for i in 0 1 2; do
  $PY run.py engine=scripted dataset=ncp_bench dataset.path="$DATASET" limit=9 max_turns=8 \
    shard.count=3 shard.index=$i out_dir="$OUT/shards" progress=false >> "$OUT/shards.log" 2>&1
done
$PY run.py mode=merge engine=scripted dataset=ncp_bench dataset.path="$DATASET" limit=9 max_turns=8 shard.count=3 \
  out_dir="$OUT/shards" >> "$OUT/shards.log" 2>&1; }

# SIGTERM halfway (the scripted engine's delay makes a run slow enough), then the same command.
if want sigterm-run; then
log sigterm-run
run_args=(engine=scripted engine.delay_s=0.02 dataset=ncp_bench dataset.path="$DATASET" limit=12 max_turns=10
  out_dir="$OUT/sigterm-run" progress=false)
$PY run.py "${run_args[@]}" > "$OUT/sigterm-run.log" 2>&1 &
pid=$!
sleep 12
kill -TERM $pid
wait $pid || echo "sigterm-run: first exit $?" >> "$OUT/sigterm-run.log"
$PY run.py "${run_args[@]}" >> "$OUT/sigterm-run.log" 2>&1
$PY run.py "${run_args[@]/sigterm-run/sigterm-run-whole}" > "$OUT/sigterm-run-whole.log" 2>&1
fi

if want sigterm-sweep; then
log sigterm-sweep
sweep_args=(-m hydra/launcher=batched engine=scripted engine.delay_s=0.02 max_turns=10 seed=0,1
  narrator.temperature=0.2,0.6 progress=false)
mkdir -p "$OUT/sigterm-sweep" "$OUT/sigterm-sweep-whole"
(cd "$OUT/sigterm-sweep" && exec $PY "$REPO/run.py" "${sweep_args[@]}" hydra.sweep.dir=sweep) > "$OUT/sigterm-sweep.log" 2>&1 &
pid=$!
sleep 12
kill -TERM $pid
wait $pid || echo "sigterm-sweep: first exit $?" >> "$OUT/sigterm-sweep.log"
(cd "$OUT/sigterm-sweep" && $PY "$REPO/run.py" "${sweep_args[@]}" hydra.sweep.dir=sweep) >> "$OUT/sigterm-sweep.log" 2>&1
(cd "$OUT/sigterm-sweep-whole" && $PY "$REPO/run.py" "${sweep_args[@]}" hydra.sweep.dir=sweep) \
  > "$OUT/sigterm-sweep-whole.log" 2>&1
fi
log "done: $OUT"
