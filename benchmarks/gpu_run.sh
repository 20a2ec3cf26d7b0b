#!/usr/bin/env bash
# The GPU check in one call: CuPy against PyTorch CUDA at the medium config and large
# batches (and the default config for contrast), then the CuPy test session.
#
# Run from the repository root on a machine with an NVIDIA GPU, CuPy and PyTorch (CUDA).
# Where array-api-compat, array-api-strict or mimesis are missing and nothing can be
# installed from the network, put their wheels in .whl/ first. Results go to $OUT
# (default benchmarks/out/gpu, which git ignores).
#
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

{
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
    python3 - <<'EOF'
import cupy, numpy, torch
print("cupy", cupy.__version__, "cuda runtime", cupy.cuda.runtime.runtimeGetVersion())
print("torch", torch.__version__, "float32 matmul precision", torch.get_float32_matmul_precision(),
      "allow_tf32", torch.backends.cuda.matmul.allow_tf32)
print("numpy", numpy.__version__, "cpus", __import__("os").cpu_count())
EOF
} 2>&1 | tee "$OUT/env.txt"

bench() {  # bench NAME ARGS...: one benchmark process, its table and JSON under $OUT
    local name=$1
    shift
    timeout "${BENCH_TIMEOUT:-150}" python3 -m benchmarks.bench --backend cupy --dtype float32 \
        --repeats 5 --gap 0.05 --case-timeout 30 --json "$OUT/$name.json" "$@" \
        2>&1 | tee "$OUT/$name.txt"
}
bench gpu-medium --config medium --workload train,score --batch-size 32,256,1024 \
    --peers torch,torch_sdpa,matmul
bench gpu-decode --config medium,default --workload decode --decode-batch-size 256,1024,8192 \
    --peers torch --no-breakdown
bench gpu-default --config default --workload train --batch-size 64,4096 --peers torch,matmul

MICROGPT_XP_BACKENDS=cupy MICROGPT_XP_BACKEND_ONLY=1 timeout 150 \
    python3 -m pytest -q -p no:cacheprovider -rfs --tb=short --durations=5 tests \
    2>&1 | tee "$OUT/tests-cupy.txt" | tail -n 25
