"""Do the implementations' thread pools disturb each other's rounds?

Times ours against the torch peer (default config, float32) in interleaved rounds with
no pause before each measurement and with a pause, alternately, and prints the median of
the per-round ratios torch/ours of each run:

    python -m benchmarks.gap_check [--gap 0.3] [--repeats 9]    # from the repository root

Needs torch (the ``bench`` extra).
"""

from __future__ import annotations

import argparse

import numpy as np

from benchmarks.bench import timing
from benchmarks.bench.peers import make_peer
from benchmarks.bench.workloads import Case, ours, parse_config


def ratio(workload: str, batch: int, gap: float, repeats: int) -> tuple[float, float, float]:
    """Median, min and max of the per-round ratios torch/ours over the clean rounds."""
    name, cfg = parse_config("default")
    case = Case(workload, name, cfg, batch, "float32", "numpy")
    timed = [ours(case), make_peer("torch", case)]
    for t in timed:
        timing.calibrate(t, 2, 0.2)
    rounds = timing.interleave(timed, repeats, gap=gap)
    r = [s["torch"] / s[timed[0].name] for s in rounds.kept_seconds()]
    return float(np.median(r)), min(r), max(r)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gap", type=float, default=0.3)
    ap.add_argument("--repeats", type=int, default=9)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(2)
    timing.tune_malloc()
    for workload, batch in (("train", 64), ("decode", 1024)):
        for gap in (args.gap, 0.0, args.gap, 0.0):
            m, lo, hi = ratio(workload, batch, gap, args.repeats)
            print(f"{workload} gap={gap}: ratio {m:.2f} ({lo:.2f}-{hi:.2f})", flush=True)


if __name__ == "__main__":
    main()
