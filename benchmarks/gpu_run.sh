#!/usr/bin/env bash
# The GPU check in one call, from the repository root on a machine with an NVIDIA GPU, CuPy
# and PyTorch (CUDA): CuPy against PyTorch CUDA at the medium config and large batches (and
# the default config for contrast), then the CuPy test session. Wheels put in .whl/ are
# installed first where the network is out of reach. Results go to $OUT (benchmarks/out/gpu).
#   bash benchmarks/gpu_run.sh
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-benchmarks/out/gpu}
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# the exact-replay test reads ../shared/data/names.txt where it exists
if [ -f .whl/names.txt ] && [ ! -f ../shared/data/names.txt ]; then
    mkdir -p ../shared/data 2>/dev/null && cp .whl/names.txt ../shared/data/ 2>/dev/null
fi
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  python3 -c 'import cupy, numpy, torch; print(cupy.__version__, numpy.__version__, torch.__version__)'
} 2>&1 | tee "$OUT/env.txt"
bench() {  # bench NAME ARGS...: one benchmark process, its tables and JSON under $OUT
    local name=$1
    shift
    timeout "${BENCH_TIMEOUT:-150}" python3 -m benchmarks.bench --backend cupy --dtype float32 \
        --repeats 5 --gap 0.05 --case-timeout 30 --json "$OUT/$name.json" "$@" 2>&1 | tee "$OUT/$name.txt"
}
bench gpu-medium --config medium --workload train,score --batch-size 32,256,1024 \
    --peers torch,matmul
bench gpu-decode --config medium,default --workload decode --decode-batch-size 256,1024,8192 \
    --peers torch --no-breakdown
bench gpu-default --config default --workload train --batch-size 64,4096 --peers torch,matmul
MICROGPT_XP_BACKENDS=cupy MICROGPT_XP_BACKEND_ONLY=1 timeout 150 \
    python3 -m pytest -q -p no:cacheprovider -rfs --tb=short --durations=5 tests \
    2>&1 | tee "$OUT/tests-cupy.txt" | tail -n 25
