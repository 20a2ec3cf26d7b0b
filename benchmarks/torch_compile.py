"""torch.compile of the pure training step on the CPU: how long it compiles, and what a
step costs compiled and eagerly (docs/compiled.md, "PyTorch: torch.compile does not pay
here").

    python benchmarks/torch_compile.py        # needs torch and a C++ compiler (inductor)
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

import microgpt_xp as mx
from microgpt_xp.model import _train_step

CASES = {
    "default": (mx.GPTConfig(27), 64, 30),
    "medium": (mx.GPTConfig(27, n_layer=4, n_embd=128, n_head=4, block_size=64), 32, 8),
}


def _per_step(
    fn: Callable[..., Any], start: tuple[Any, Any], batch: tuple[Any, Any], n: int
) -> float:
    params, state = start
    t0 = time.perf_counter()
    for _ in range(n):
        params, state, loss = fn(params, state, *batch)
        float(loss)
    return (time.perf_counter() - t0) / n


def main() -> None:
    """Compile the step of each case, then time eager and compiled steps, interleaved."""
    torch.set_num_threads(2)
    for name, (cfg, b, n) in CASES.items():
        params = mx.init_params(cfg, backend="torch")
        start = (params, mx.adam_init(params))
        rng = np.random.default_rng(0)
        batch = (
            torch.from_numpy(rng.integers(0, cfg.vocab_size, (b, cfg.block_size + 1))),
            torch.full((b,), cfg.block_size + 1),
        )
        eager = functools.partial(
            _train_step, reduction="mean", lr=0.01, beta1=0.85, beta2=0.99, eps=1e-8, num_steps=1000
        )
        t0 = time.perf_counter()
        compiled = torch.compile(eager)
        _per_step(compiled, start, batch, 1)
        compile_s = time.perf_counter() - t0
        for _ in range(3):
            _per_step(compiled, start, batch, 2)
            _per_step(eager, start, batch, 2)
        eager_t, compiled_t = [], []
        for _ in range(5):
            eager_t.append(_per_step(eager, start, batch, n))
            compiled_t.append(_per_step(compiled, start, batch, n))
        print(
            f"{name} B={b}: compile {compile_s:.1f} s, eager {statistics.median(eager_t) * 1e3:.2f} "
            f"ms, compiled {statistics.median(compiled_t) * 1e3:.2f} ms",
            flush=True,
        )


if __name__ == "__main__":
    main()
