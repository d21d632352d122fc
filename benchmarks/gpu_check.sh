#!/usr/bin/env bash
# The GPU check in one device call, on a machine prepared by ../shared/device/prepare.sh --taichi:
#   device run, carry [".device"], command: bash .device/run.sh 'bash benchmarks/gpu_check.sh'
# In order, each stopped at its time limit (seconds; by default about 530 s in all, within the
# device tool's 600 s a call):
#   adapter.txt       python -m wgpu_ad: the adapter wgpu_ad picks, its features and limits
#   pytest.log        the test suite on all cores (SUITE_S, 220), one line per test as it ends (-v),
#                     so a run stopped at its limit keeps the names; failed.txt: the failed ones
#   bench.log/.json   the workloads against the GPU users' anchors (BENCH_S, 190): wgpu_ad, wgsl,
#                     taichi-cuda, taichi-vulkan, torch (CUDA), jax (CUDA), and the copy bandwidth
#                     beside the reduction (BENCH_SYSTEMS, BENCH_ONLY, BENCH_ARGS to change them)
#   compile.log/.json torch.compile on the same workloads beside wgpu_ad (COMPILE_S, 90: Triton
#                     compiles each case first; a case that does not compile says why)
#   extra.log/.json   only with EXTRA_S > 0: compile times, the torch bridge, checkpoint, fwdmode
# The JSON is rewritten after every case, so a stage stopped at its limit keeps the cases it did.
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
export XLA_PYTHON_CLIENT_PREALLOCATE=false   # JAX takes GPU memory as it needs it, not 75 % up front
workers=$(( $(nproc) > 12 ? 12 : $(nproc) ))
parallel="-n $workers"; $PY -c "import xdist" 2>/dev/null || parallel=""   # pytest-xdist where installed

$PY -c "import torch, jax, numpy; print('torch', torch.__version__, 'cuda', torch.cuda.is_available()); \
print('jax', jax.__version__, jax.devices(), 'numpy', numpy.__version__)" 2>&1 | tee "$OUT/versions.txt"
$PY -c "import taichi; print('taichi', taichi.__version__)" >> "$OUT/versions.txt" 2>&1
timeout 60 $PY -m wgpu_ad > "$OUT/adapter.txt" 2>&1; echo "python -m wgpu_ad exit: $?"; head -n 5 "$OUT/adapter.txt"

timeout "${SUITE_S:-220}" $PY -m pytest -v $parallel -p no:cacheprovider -p no:benchmark -rfE \
  ${PYTEST_ARGS:-} > "$OUT/pytest.log" 2>&1
echo "pytest exit: $? (124: stopped at ${SUITE_S:-220} s)" | tee -a "$OUT/pytest.log"
grep -E '(FAILED|ERROR) ' "$OUT/pytest.log" | sed -E 's/^\[gw[0-9]+\] \[ *[0-9]+%\] //' | sort -u > "$OUT/failed.txt"
echo "failed or erroring: $(wc -l < "$OUT/failed.txt")"; head -n 40 "$OUT/failed.txt"
grep -E '^[0-9]+ (passed|failed)|passed|failed' "$OUT/pytest.log" | tail -n 1

installed() {  # the systems of a comma-separated list whose library imports here (the others: a note)
  $PY -c "import sys; from benchmarks.systems import installed as ok; want = sys.argv[1].split(',')
print(','.join(s for s in want if ok(s))); [print('not installed, left out:', s, file=sys.stderr) for s in want if not ok(s)]" "$1"
}
bench() {  # bench NAME LIMIT ARGS...: one stage of the benchmarks
  local name=$1 limit=$2; shift 2
  timeout "$limit" $PY -m benchmarks --json "$OUT/$name.json" "$@" > "$OUT/$name.log" 2>&1
  echo "benchmarks ($name) exit: $? (124: stopped at $limit s)"
  grep -A 30 '^Medians' "$OUT/$name.log" || grep -E '^  (fwd|fwd\+bwd|launches|sync|copy) ' "$OUT/$name.log"
}
bench bench "${BENCH_S:-190}" --only "${BENCH_ONLY:-gravity,cloth,reduction,scatter,launch}" \
  --systems "$(installed "${BENCH_SYSTEMS:-wgpu_ad,wgsl,taichi-cuda,taichi-vulkan,torch,jax}")" --reps "${BENCH_REPS:-5}" ${BENCH_ARGS:-}
bench compile "${COMPILE_S:-90}" --only "${COMPILE_ONLY:-gravity,cloth,reduction,scatter}" \
  --systems "$(installed wgpu_ad,torch-compile)" --reps "${BENCH_REPS:-5}"
# ti.init(deterministic=True) against the default: its cost on a GPU, where a task with float
# atomics in one invocation loses the most (never measured on one yet)
bench determinism "${DET_S:-60}" --only determinism --systems wgpu_ad
if (( ${EXTRA_S:-0} > 0 )); then
  bench extra "$EXTRA_S" --only compile,torch,checkpoint,fwdmode --systems "$(installed wgpu_ad,wgsl,taichi-vulkan)" \
    --checkpoint-steps 500
fi
