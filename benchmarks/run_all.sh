#!/usr/bin/env bash
# The CPU figures of docs/performance.md (a few minutes on 2 quiet cores), from anywhere:
#   bash benchmarks/run_all.sh [--untuned]   # --untuned: also a run with --no-tune-malloc
# Writes $OUT/NAME.{json,txt} (OUT defaults to benchmarks/out, which git ignores).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
OUT=${OUT:-benchmarks/out}
mkdir -p "$OUT"
run() {  # run NAME [bench options...]
    local name=$1
    shift
    "$PY" -m benchmarks.bench "$@" --json "$OUT/$name.json" | tee "$OUT/$name.txt" \
        || echo "($name: a target was missed, or the run failed: see above)"
}
run parity --backend numpy,torch --config default,medium --workload train,text --peers torch --threads 2 --check-targets
run parity1 --backend numpy,torch --config default,medium --workload train,text --peers torch --threads 1 --no-breakdown
run jax --backend jax --config default,medium --workload train --peers jax --no-breakdown
run bigb --backend numpy --config default --workload train --batch-size 64,1024 --peers torch --no-breakdown
run results
if [[ "${1:-}" == "--untuned" ]]; then
    run results-untuned --no-tune-malloc
fi
"$PY" -m benchmarks.e2e workers --json "$OUT/workers.json" | tee "$OUT/workers.txt"
