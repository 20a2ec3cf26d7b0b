"""When do host threads pay? A training step (``loss_and_grads`` + ``Adam.step``) and a
decode of NumPy batches run three ways: one thread with BLAS as it is, one thread with
one BLAS thread, and two threads on half the rows each with one BLAS thread each (the
plans of ``microgpt_xp._threads``). Prints the median of ``--rounds`` interleaved rounds
(each the median of ``--calls`` calls) in ms, and the plan that ``workers=None`` picks.

    python benchmarks/threads_split.py [--rounds 5] | tee benchmarks/threads_split.txt
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import microgpt_xp as mx
from microgpt_xp import _threads
from microgpt_xp._alloc import tune_malloc
from microgpt_xp.sample import decode_batch

CASES = [  # (workload, L, C, T, B)
    ("train", 1, 16, 16, 64),
    ("train", 1, 16, 16, 256),
    ("train", 1, 16, 16, 1024),
    ("train", 1, 32, 16, 64),
    ("train", 2, 64, 32, 32),
    ("train", 4, 128, 64, 8),
    ("train", 4, 128, 64, 32),
    ("decode", 1, 16, 16, 1024),
    ("decode", 1, 16, 16, 4096),
    ("decode", 4, 128, 64, 256),
]
PLANS = {
    "1 thread, BLAS as is": _threads.Plan(1, None),
    "1 thread, BLAS 1": _threads.Plan(1, 1),
    "2 threads, BLAS 1 each": _threads.Plan(2, 1),
}


def _work(workload: str, cfg: mx.GPTConfig, b: int) -> Callable[[int, int], Any]:
    params = mx.init_params(cfg, dtype="float32")
    t = cfg.block_size
    if workload == "decode":
        u = np.random.default_rng(1).random((b, t))
        return lambda s, e: decode_batch(params, cfg.vocab_size - 1, u[s:e], 2.0, early_stop=False)
    tok = np.random.default_rng(0).integers(0, cfg.vocab_size, (b, t + 1))
    lens = np.full(b, t + 1)
    adam = mx.Adam(params, num_steps=10**9)

    def step(s: int, e: int) -> Any:
        loss, grads = mx.loss_and_grads(params, tok[s:e], lens[s:e])
        return adam.step(params, grads), loss

    return step


def _median_ms(fn: Callable[[], Any], calls: int) -> float:
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times)) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--budget", type=float, default=0.3, help="seconds a measurement")
    args = ap.parse_args()
    tune_malloc()
    print(f"usable CPUs {_threads.usable_cpus()}; ms, median of {args.rounds} rounds")
    print(f"{'case':32s}" + "".join(f"{name:>24s}" for name in PLANS) + "   workers=None plan")
    for workload, n_layer, c, t, b in CASES:
        cfg = mx.GPTConfig(vocab_size=27, n_layer=n_layer, n_embd=c, n_head=4, block_size=t)
        fn = _work(workload, cfg, b)
        fn(0, b)
        start = time.perf_counter()
        fn(0, b)
        calls = max(1, int(args.budget / max(time.perf_counter() - start, 1e-6)))
        got: dict[str, list[float]] = {name: [] for name in PLANS}
        for _ in range(args.rounds):
            for name, plan in PLANS.items():
                time.sleep(0.2)  # let the other plan's BLAS threads go to sleep
                got[name].append(_median_ms(lambda p=plan, f=fn, n=b: _threads.run(p, f, n), calls))
        if workload == "decode":
            plan = _threads.decode_plan(cfg, b, None)
        else:
            plan = _threads.sequence_plan(cfg, b, t + 1, None)
        label = f"{workload} L{n_layer} C{c} T{t} B{b}"
        cells = "".join(f"{np.median(v):24.2f}" for v in got.values())
        print(f"{label:32s}{cells}   {plan.shards} x BLAS {plan.blas_threads}", flush=True)


if __name__ == "__main__":
    main()
