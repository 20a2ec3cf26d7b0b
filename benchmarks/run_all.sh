#!/usr/bin/env bash
# Reproduce the CPU figures of docs/performance.md (a few minutes on 2 quiet cores).
# Run from anywhere; it works from the repository root.
#
#   bash benchmarks/run_all.sh             # BLAS/torch threads as they are, 1 thread each,
#                                          # and PyTorch tensors through our code
#   bash benchmarks/run_all.sh --untuned   # also a run with --no-tune-malloc
#
# Writes $OUT/results*.{json,txt,png} and $OUT/micro_ops.{json,txt} (OUT defaults to
# benchmarks/out, which git ignores). Run it on a quiet machine: rounds in which other
# processes used the CPUs are dropped (and counted in the tables).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
OUT=${OUT:-benchmarks/out}
mkdir -p "$OUT"

run() {  # run NAME [bench options...]
    local name=$1
    shift
    "$PY" -m benchmarks.bench "$@" --json "$OUT/$name.json" --plot "$OUT/$name.png" \
        | tee "$OUT/$name.txt"
}

run results --check-targets || echo "(a target was missed: see the table above)"
run results-1thread --threads 1 --check-targets || echo "(a target was missed: see above)"
run results-torch --backend torch --workload train --peers torch --check-targets \
    || echo "(a target was missed: see above)"
"$PY" benchmarks/micro_ops.py --json "$OUT/micro_ops.json" | tee "$OUT/micro_ops.txt"
if [[ "${1:-}" == "--untuned" ]]; then
    run results-untuned --no-tune-malloc
fi
