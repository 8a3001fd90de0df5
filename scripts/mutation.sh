#!/usr/bin/env bash
# Mutation testing of the estimator code with mutmut 3 (docs/development/testing.md, "Mutation testing").
#
# Usage: scripts/mutation.sh [MUTMUT] [WORKDIR] [MODULE.py ...]
#   MUTMUT   the mutmut command, from a venv of its own (default /tmp/mut-venv/bin/mutmut); that venv must
#            see the project's dependencies, e.g. a .pth file naming the project venv's site-packages
#   WORKDIR  a scratch folder (default /tmp/ncp-mutation): the tracked files are copied there and the
#            mutmut configuration added to the copy's pyproject.toml, so the checkout is never touched
#   MODULE   the modules to mutate (default: the five estimator modules below)
# MUTANTS (environment): mutant names or globs to run, e.g. 'ncp_local.report.precision.x__point__mutmut_*'
#            (default: every mutant of the modules)
#
# The tests are the fast ones that check the estimators' behaviour (no engine, no scripted run): a
# mutant in a function none of them reaches is "no tests", not "survived".
set -euo pipefail
MUTMUT=${1:-/tmp/mut-venv/bin/mutmut}
WORK=${2:-/tmp/ncp-mutation}
shift $(( $# > 2 ? 2 : $# ))
MODULES=("$@")
if [ ${#MODULES[@]} -eq 0 ]; then
  MODULES=(ncp_local/protocol/metrics.py ncp_local/protocol/resample.py ncp_local/report/trials.py
           ncp_local/report/precision.py ncp_local/report/auditors.py)
fi
ROOT=$(cd "$(dirname "$0")/.." && pwd)
if ! command -v "$MUTMUT" >/dev/null; then
  echo "error: mutmut: $MUTMUT not found (python3 -m venv /tmp/mut-venv && /tmp/mut-venv/bin/pip install mutmut)" >&2
  exit 2
fi
rm -rf "$WORK" && mkdir -p "$WORK"
(cd "$ROOT" && git ls-files ncp_local tests pyproject.toml | tar -cf - -T -) | tar -xf - -C "$WORK"
only=$(printf '"%s", ' "${MODULES[@]}")
cat >>"$WORK/pyproject.toml" <<EOF

[tool.mutmut]
source_paths = ["ncp_local/"]
only_mutate = [${only%, }]
pytest_add_cli_args = ["-q", "-p", "no:cacheprovider", "-p", "no:randomly"]
pytest_add_cli_args_test_selection = [
  "tests/test_estimators.py",
  "tests/test_metrics.py",
  "tests/test_endings.py",
  "tests/test_precision.py::test_product_limit_is_kaplan_meier_and_matches_lifelines",
  "tests/test_precision.py::test_a_small_sheet_puts_the_point_inside_its_interval_and_keeps_the_precisions_uncertainty",
  "tests/test_trials.py::test_pass_k_is_the_share_of_k_subsets_that_all_survive",
  "tests/test_trials.py::test_noise_floor_by_hand",
  "tests/test_trials.py::test_story_bootstrap_draws_a_storys_trials_together",
]
EOF
cd "$WORK"
# The copy's ncp_local, not the checkout's: no PYTHONPATH, no official dataset (its tests start runs).
# shellcheck disable=SC2086  # MUTANTS is a list of names or globs, split on purpose
env -u PYTHONPATH -u NCP_BENCH_DATASET "$MUTMUT" run --max-children 2 ${MUTANTS:-}
"$MUTMUT" results --all true | awk '{print $NF}' | sort | uniq -c
