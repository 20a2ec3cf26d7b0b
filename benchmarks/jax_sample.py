"""The first ``sample`` call on JAX against NumPy's (docs/compiled.md): trains the default
config 50 steps (B=32, float32), then samples ``--num-samples`` names twice on NumPy and
twice on JAX (``--jit`` as the library's ``jit``), timing each call. Run it twice with
JAX's persistent compilation cache on to see what a later process pays:

    python benchmarks/jax_sample.py [--num-samples 2000] [--no-jit]
    JAX_COMPILATION_CACHE_DIR=~/.cache/jax JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 \\
        python benchmarks/jax_sample.py
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import microgpt_xp as mx


def _timed(fn: Callable[[], list[str]]) -> tuple[float, list[str]]:
    """Seconds one call of ``fn`` takes, and what it returned."""
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def main() -> None:
    """Train, sample on both backends and print one line of figures."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--num-samples", type=int, default=2000)
    ap.add_argument("--jit", action=argparse.BooleanOptionalAction, default=None)
    args = ap.parse_args()
    result = mx.train(mx.default_docs(), steps=50, batch_size=32, dtype="float32")
    params, tokenizer, n = result.params, result.tokenizer, args.num_samples
    numpy_times = [_timed(lambda: mx.sample(params, tokenizer, n, seed=1)) for _ in range(2)]
    on_jax = params.to("jax")
    jax_times = [
        _timed(lambda: mx.sample(on_jax, tokenizer, n, seed=1, jit=args.jit)) for _ in range(2)
    ]
    base = numpy_times[1][0]
    print(
        f"sample {n} names: numpy {numpy_times[0][0]:.3f} s, {base:.3f} s; jax (jit="
        f"{args.jit}) first {jax_times[0][0]:.3f} s ({jax_times[0][0] / base:.1f}x), second "
        f"{jax_times[1][0]:.3f} s ({jax_times[1][0] / base:.1f}x); same names: "
        f"{jax_times[1][1] == numpy_times[1][1]}"
    )


if __name__ == "__main__":
    main()
