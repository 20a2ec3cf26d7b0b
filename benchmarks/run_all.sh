#!/usr/bin/env bash
# Reproduce the figures of docs/performance.md (a few minutes on 2 quiet cores).
#
#   bash benchmarks/run_all.sh             # BLAS/torch threads as they are, and 1 thread each
#   bash benchmarks/run_all.sh --untuned   # also a run with --no-tune-malloc
#
# Writes benchmarks/results*.{json,txt,png}. Run it on a quiet machine: rounds in which
# other processes used the CPUs are dropped (and counted in the tables).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}

run() {  # run NAME [bench options...]
    local name=$1
    shift
    "$PY" -m microgpt_xp.bench "$@" --json "benchmarks/$name.json" --plot "benchmarks/$name.png" \
        | tee "benchmarks/$name.txt"
}

run results --check-targets || echo "(a target was missed: see the table above)"
run results-1thread --threads 1 --check-targets || echo "(a target was missed: see above)"
"$PY" benchmarks/micro_ops.py --json benchmarks/micro_ops.json | tee benchmarks/micro_ops.txt
if [[ "${1:-}" == "--untuned" ]]; then
    run results-untuned --no-tune-malloc
fi
