"""A/B-time two copies of the package in one process, interleaved, with the /proc/stat
filter of ``python -m benchmarks.bench`` (used to measure proposed changes to
layers.py/model.py without touching the repository). From the repository root:

    python -m benchmarks.ab_variants A_DIR B_DIR [--workload train] [--config default]
        [--batch 64] [--repeats 9] [--min-time 0.2] [--tune-malloc] [--gap 0.3]

``A_DIR`` and ``B_DIR`` each hold a ``microgpt_xp`` package (e.g. the repository root and a
scratch copy with an edited ``layers.py``). Each is imported under its own name, so both
run in the same process on the same data. Prints seconds per call of each and the
median of the per-round speedups ``time(A) / time(B)`` over the undisturbed rounds.
"""

from __future__ import annotations

import argparse
import importlib
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.bench.timing import Timed, calibrate, interleave, summary, tune_malloc

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


def timed(name: str, mods: dict, workload: str, config: str, batch: int) -> Timed:
    """One training step / score / decode of the package ``mods`` as a ``Timed``."""
    pkg, model, optim, sample, layers = (
        mods[k] for k in ("", "model", "optim", "sample", "layers")
    )
    cfg = pkg.GPTConfig(**CONFIGS[config])
    params = pkg.init_params(cfg, dtype="float32")
    t = cfg.block_size
    tok = np.random.default_rng([0, 1]).integers(0, cfg.vocab_size, (batch, t + 1))
    lens = np.full(batch, t + 1)
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    ap.add_argument(
        "--workload", default="train", choices=["train", "score", "decode", "decode_step"]
    )
    ap.add_argument("--config", default="default", choices=sorted(CONFIGS))
    ap.add_argument("--batch", type=int, default=64)
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
    with tempfile.TemporaryDirectory() as tmp:
        ts = [
            timed(n, load(d, f"mgx_{n}", Path(tmp)), args.workload, args.config, args.batch)
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
