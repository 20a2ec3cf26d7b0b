#!/usr/bin/env bash
# Reproduce the figures of docs/performance.md (about 1-2 minutes a run on 2 quiet cores).
#
#   bash benchmarks/run_all.sh             # the package as it is, plain and with --tune-malloc
#   bash benchmarks/run_all.sh --proposed  # also a scratch copy with proposed_layers.diff applied
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

run results
run results-malloc --tune-malloc

if [[ "${1:-}" == "--proposed" ]]; then
    scratch=$(mktemp -d)
    trap 'rm -rf "$scratch"' EXIT
    cp -r microgpt_xp "$scratch/"
    patch -s -d "$scratch" -p1 < benchmarks/proposed_layers.diff
    PYTHONPATH="$scratch" run proposed
    PYTHONPATH="$scratch" run proposed-malloc --tune-malloc
    # the change alone, interleaved against the package as it is
    for w in "train default 64" "decode default 1024" "train medium 32"; do
        set -- $w
        "$PY" benchmarks/ab_variants.py . "$scratch" --workload "$1" --config "$2" --batch "$3"
    done | tee benchmarks/proposed-ab.txt
fi
