"""Worker processes against the calling process alone (docs/performance.md, "Worker
processes"): ``train(..., workers=2)`` against ``train(..., workers=None)`` on NumPy,
float32, seconds per step in the steady state (the median gap between the callback's
timestamps after three warm-up steps) and the start-up of the workers (the first step's
extra time). Rounds interleave the two; the speed-up is taken per round, then the median.

    python benchmarks/workers.py [--rounds 5] [--steps 40]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from typing import Any

import microgpt_xp as mx


def _run(steps: int, **kwargs: Any) -> tuple[float, float]:
    """``(seconds per step in the steady state, seconds of the first step)``."""
    stamps: list[float] = []
    t0 = time.perf_counter()
    mx.train(steps=steps, callback=lambda s, loss: stamps.append(time.perf_counter()), **kwargs)
    gaps = [b - a for a, b in itertools.pairwise(stamps)][3:]
    return statistics.median(gaps), stamps[0] - t0


def main() -> None:
    """Measure each case and print a line of figures."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=40)
    args = ap.parse_args()
    docs = mx.default_docs()
    vocab = mx.Tokenizer.from_docs(docs).vocab_size
    default = mx.GPTConfig(vocab)
    medium = mx.GPTConfig(vocab, n_layer=4, n_embd=128, n_head=4, block_size=64)
    cases = [
        ("default", default, 64),
        ("default", default, 1024),
        ("medium", medium, 32),
        ("medium", medium, 256),
    ]
    for name, config, batch in cases:
        steps = args.steps if name == "default" else max(args.steps // 4, 8)
        common = dict(docs=docs, batch_size=batch, config=config)
        ratios, one, two, start = [], [], [], []
        for i in range(args.rounds):
            order = [None, 2] if i % 2 == 0 else [2, None]
            got = {w: _run(steps, workers=w, **common) for w in order}
            one.append(got[None][0])
            two.append(got[2][0])
            start.append(got[2][1] - got[None][1])
            ratios.append(got[None][0] / got[2][0])
        print(
            f"{name} B={batch}: one process {statistics.median(one) * 1e3:.2f} ms/step, "
            f"2 processes {statistics.median(two) * 1e3:.2f} ms/step, speed-up "
            f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}); "
            f"workers' start-up {statistics.median(start):.2f} s",
            flush=True,
        )


if __name__ == "__main__":
    main()
