"""The compiled path end to end (docs/compiled.md): ``train(backend="jax")`` for 1000 steps
and ``sample`` of 2000 names against NumPy, compilation included, plus how long the first
(compiling) call takes. Side by side, rounds interleaved, the median of the per-round ratios.

    python benchmarks/compiled.py [--rounds 3] [--steps 1000] [--json benchmarks/out/compiled.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
from pathlib import Path
from typing import Any

import microgpt_xp as mx


def _train(backend: str, steps: int, batch: int, config: mx.GPTConfig) -> dict[str, float]:
    """Seconds of a whole ``train`` call and of its first step (the compilation, if any)."""
    stamps: list[float] = []
    t0 = time.perf_counter()
    mx.train(
        steps=steps,
        batch_size=batch,
        backend=backend,
        config=config,
        callback=lambda s, loss: stamps.append(time.perf_counter()),
    )
    total = time.perf_counter() - t0
    steady = statistics.median(b - a for a, b in itertools.pairwise(stamps[1:]))
    return {"total": total, "first_step": stamps[0] - t0, "step": steady}


def _sample(backend: str, params: mx.Params, tokenizer: mx.Tokenizer, n: int) -> float:
    on = params.to(backend)
    t0 = time.perf_counter()
    mx.sample(on, tokenizer, n, seed=0)
    return time.perf_counter() - t0


def main() -> None:
    """Measure and print (and optionally save) the figures."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    docs = mx.default_docs()
    tokenizer = mx.Tokenizer.from_docs(docs)
    configs = {
        "default": mx.GPTConfig(tokenizer.vocab_size),
        "medium": mx.GPTConfig(
            tokenizer.vocab_size, n_layer=4, n_embd=128, n_head=4, block_size=64
        ),
    }
    out: dict[str, Any] = {}
    for name, steps in (("default", args.steps), ("medium", max(args.steps // 10, 20))):
        rounds = []
        for i in range(args.rounds):
            order = ["numpy", "jax"] if i % 2 == 0 else ["jax", "numpy"]
            r = {b: _train(b, steps, 32, configs[name]) for b in order}
            rounds.append(r)
        ratio = statistics.median(r["jax"]["total"] / r["numpy"]["total"] for r in rounds)
        out[f"train {name} B=32, {steps} steps"] = {
            "jax_over_numpy_total": ratio,
            "rounds": rounds,
        }
        print(name, f"train {steps} steps: jax/numpy total {ratio:.2f}x", rounds[-1], flush=True)
    params = mx.train(docs, steps=200).params
    pairs = []
    for i in range(args.rounds):
        order = ["numpy", "jax"] if i % 2 == 0 else ["jax", "numpy"]
        t = {b: _sample(b, params, tokenizer, args.samples) for b in order}
        pairs.append(t)
    ratio = statistics.median(t["jax"] / t["numpy"] for t in pairs)
    out[f"sample {args.samples}"] = {"jax_over_numpy": ratio, "rounds": pairs}
    print(f"sample {args.samples}: jax/numpy {ratio:.2f}x", pairs, flush=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
