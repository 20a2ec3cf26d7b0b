"""A/B-time two copies of the package in one process, interleaved, with the /proc/stat
filter of ``python -m benchmarks.bench`` (used to measure proposed changes to
layers.py/model.py without touching the repository). From the repository root:

    python -m benchmarks.ab_variants A_DIR B_DIR [--workload train] [--config default]
        [--batch 64] [--backend numpy] [--repeats 9] [--min-time 0.2] [--tune-malloc]
        [--gap 0.3] [--threads N]

``A_DIR`` and ``B_DIR`` each hold a ``microgpt_xp`` package (e.g. the repository root and a
scratch copy with an edited ``layers.py``). Each is imported under its own name, so both
run in the same process on the same data. Prints seconds per call of each and the
median of the per-round speedups ``time(A) / time(B)`` over the undisturbed rounds.

``--backend`` puts the weights and the batch on another backend (``torch``, ``jax``, ...):
training then runs the pure ``train_step`` as ``python -m benchmarks.bench`` does (compiled
where the backend has a compiler, ``jax.jit``); on NumPy it runs ``loss_and_grads`` and
``Adam.step``, as it always has.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.bench.timing import (
    Timed,
    calibrate,
    interleave,
    set_blas_threads,
    summary,
    tune_malloc,
)

CONFIGS = {
    "default": dict(vocab_size=27, n_layer=1, n_embd=16, n_head=4, block_size=16),
    "medium": dict(vocab_size=27, n_layer=4, n_embd=128, n_head=4, block_size=64),
}


def load(src: Path, alias: str, scratch: Path):
    """Import ``src/microgpt_xp`` as the package ``alias`` (a copy under ``scratch``)."""
    shutil.copytree(
        src / "microgpt_xp", scratch / alias, ignore=shutil.ignore_patterns("bench", "__pycache__")
    )
    if str(scratch) not in sys.path:
        sys.path.insert(0, str(scratch))
    return {
        m: importlib.import_module(f"{alias}{'.' + m if m else ''}")
        for m in ("", "model", "optim", "sample", "layers")
    }


def timed(
    name: str, mods: dict, workload: str, config: str, batch: int, backend: str = "numpy"
) -> Timed:
    """One training step / score / decode of the package ``mods`` as a ``Timed``."""
    pkg, model, optim, sample, layers = (
        mods[k] for k in ("", "model", "optim", "sample", "layers")
    )
    xpmod = importlib.import_module(f"{pkg.__name__}._xp")
    cfg = pkg.GPTConfig(**CONFIGS[config])
    params = pkg.init_params(cfg, dtype="float32", backend=backend)
    t = cfg.block_size
    host_tok = np.random.default_rng([0, 1]).integers(0, cfg.vocab_size, (batch, t + 1))
    tok = xpmod.asarray(host_tok, backend)
    lens = xpmod.asarray(np.full(batch, t + 1), backend)
    if workload == "train" and backend != "numpy":
        return _pure_train(name, pkg, xpmod, model, optim, params, tok, lens, batch * t, backend)
    if workload == "train":
        adam = optim.Adam(params, num_steps=2**62)
        state = {"p": params, "n": 0}

        def step() -> float:
            state["n"] += 1
            if state["n"] % 100 == 0:  # back to the initial weights, as the bench does
                state["p"] = params
            loss, grads = model.loss_and_grads(state["p"], tok, lens)
            state["p"] = adam.step(state["p"], grads)
            return float(loss)

        return Timed(name, step, batch * t)
    if workload == "score":
        return Timed(name, lambda: float(model.score(params, tok, lens)[0]), batch * t)
    u = np.random.default_rng([0, 2]).random((batch, t)).astype("float32")
    start = np.full(batch, cfg.vocab_size - 1, dtype=np.int64)

    if workload == "decode":  # the sampler's own loop, as benchmarks.bench times it
        bos = cfg.vocab_size - 1
        return Timed(
            name,
            lambda: int(sample.decode_batch(params, bos, u, 2.0, early_stop=False)[0, -1]),
            batch * t,
        )

    def decode() -> int:  # "decode_step": the public step and draw, one position at a time
        token, cache = start, model.KVCache()
        for pos in range(t):
            logits, cache = model.decode_step(params, token, cache)
            token = sample.choose(layers.softmax(logits * 2.0), u[:, pos])
        return int(token[0])

    return Timed(name, decode, batch * t)


def _pure_train(name, pkg, xpmod, model, optim, params, tok, lens, tokens, backend) -> Timed:
    """The pure training step as the benchmark runs it on ``backend`` (compiled where the
    backend has a compiler), the loss read to the host."""
    hyper = optim.Adam(params, num_steps=2**62).hyperparameters
    step = functools.partial(model._train_step, reduction="mean", **hyper)
    compile_fn = xpmod.compiler(backend, None)
    if compile_fn is not None:
        step = compile_fn(step)
    state = {"p": params, "s": optim.adam_init(params), "n": 0}

    def call() -> float:
        state["n"] += 1
        if state["n"] % 100 == 0:  # back to the initial weights, as the bench does
            state["p"] = params
        state["p"], state["s"], loss = step(state["p"], state["s"], tok, lens)
        return float(xpmod.to_numpy(loss))

    return Timed(name, call, tokens)


def set_threads(n: int) -> None:
    """NumPy's BLAS and torch (where installed) to ``n`` threads, as ``bench --threads``."""
    set_blas_threads(n)
    try:
        import torch
    except ImportError:
        return
    torch.set_num_threads(n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    ap.add_argument(
        "--workload", default="train", choices=["train", "score", "decode", "decode_step"]
    )
    ap.add_argument("--config", default="default", choices=sorted(CONFIGS))
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--backend", default="numpy", help="numpy (default), torch, jax, ...")
    ap.add_argument(
        "--threads", type=int, default=None, help="BLAS and torch threads (default: as they are)"
    )
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--min-time", type=float, default=0.2)
    ap.add_argument("--max-other", type=float, default=0.05)
    ap.add_argument(
        "--gap", type=float, default=0.3, help="idle seconds before each measurement (as bench)"
    )
    ap.add_argument("--tune-malloc", action="store_true")
    args = ap.parse_args()
    if args.tune_malloc:
        tune_malloc()
    if args.threads is not None:
        set_threads(args.threads)
    if args.backend == "jax":
        # imported before the two copies: each would otherwise install its own import hook
        # for JAX's pytrees, and the two hooks would call each other without end
        importlib.import_module("jax")
    with tempfile.TemporaryDirectory() as tmp:
        ts = [
            timed(
                n,
                load(d, f"mgx_{n}", Path(tmp)),
                args.workload,
                args.config,
                args.batch,
                args.backend,
            )
            for n, d in (("a", args.a), ("b", args.b))
        ]
        for t in ts:
            calibrate(t, 3, args.min_time)
        rounds = interleave(
            ts,
            args.repeats,
            max_other=args.max_other,
            deadline=time.perf_counter() + 300,
            gap=args.gap,
        )
    kept = rounds.kept_seconds()
    print(
        f"{args.workload} {args.config} B={args.batch}: {rounds.kept.count(True)} rounds kept, "
        f"{rounds.dropped} dropped{'' if rounds.filtered else ' (unfiltered)'}"
    )
    for t in ts:
        s = summary([r[t.name] for r in kept])
        print(
            f"  {t.name}: {s['median'] * 1e3:.3f} ms/call [{s['min'] * 1e3:.3f}-{s['max'] * 1e3:.3f}]"
        )
    sp = summary([r["a"] / r["b"] for r in kept])
    print(f"  speedup B over A: median {sp['median']:.3f} [{sp['min']:.3f}-{sp['max']:.3f}]")


if __name__ == "__main__":
    main()
