#!/usr/bin/env bash
# The GPU check in one device call, on a machine prepared by ../shared/device/prepare.sh --taichi:
#   device run, carry [".device"], command: bash .device/run.sh 'bash benchmarks/gpu_check.sh'
# Runs the test suite on all cores (stopped after SUITE_S seconds), then `python -m benchmarks`
# (stopped after BENCH_S seconds). Everything lands under $OUT:
#   pytest.log  one line per test as it ends (-v), so a run stopped at its limit keeps the names
#   failed.txt  the failed and erroring tests, read from pytest.log
#   bench.log, bench.json  the benchmarks (the JSON only when they finish)
# Lessons of the first run (2026-11-26, RESULTS.md): on that machine `python` is not the venv that
# holds torch and jax (use python3), and the checkout comes first on sys.path, so the package needs
# the layout pip installs (wgpu_ad/shaders and wgpu_ad/viewer; links here, on that machine only).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
PY=${PYTHON:-python3}
[[ -e wgpu_ad/shaders ]] || ln -s ../shaders wgpu_ad/shaders
[[ -e wgpu_ad/viewer ]] || ln -s ../viewer wgpu_ad/viewer
export WGPU_AD_CACHE_DIR; WGPU_AD_CACHE_DIR=$(mktemp -d)
workers=$(( $(nproc) > 12 ? 12 : $(nproc) ))

$PY -c "import torch, jax, numpy; print('torch', torch.__version__, 'jax', jax.__version__, 'numpy', numpy.__version__)" \
  2>&1 | tee "$OUT/versions.txt"
timeout "${SUITE_S:-300}" $PY -m pytest -v -n "$workers" -p no:cacheprovider -p no:benchmark -rfE \
  ${PYTEST_ARGS:-} > "$OUT/pytest.log" 2>&1
echo "pytest exit: $? (124: stopped at ${SUITE_S:-300} s)" | tee -a "$OUT/pytest.log"
grep -E '(FAILED|ERROR) ' "$OUT/pytest.log" | sed -E 's/^\[gw[0-9]+\] \[ *[0-9]+%\] //' | sort -u > "$OUT/failed.txt"
echo "failed or erroring: $(wc -l < "$OUT/failed.txt")"; head -n 40 "$OUT/failed.txt"
grep -E '^[0-9]+ (passed|failed)|passed|failed' "$OUT/pytest.log" | tail -n 1

timeout "${BENCH_S:-240}" $PY -m benchmarks --json "$OUT/bench.json" --checkpoint-steps 500 \
  ${BENCH_ARGS:-} > "$OUT/bench.log" 2>&1
echo "benchmarks exit: $?"
grep -A 30 '^Medians' "$OUT/bench.log"
