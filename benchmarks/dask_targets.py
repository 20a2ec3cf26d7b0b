"""Dask against NumPy, side by side: training steps, corpus scoring on threads and on a
LocalCluster of two worker processes (the figures of docs/dask.md, "What Dask costs").

- ``train``: seconds per step (steady state, from the callback's timestamps) of
  ``train(backend="dask")`` on the threaded scheduler against ``train(backend="numpy")``,
  at the default config, float32, batch 32 in one chunk and batch 4096 in chunks of 1024;
- ``eval``: what ``microgpt-xp eval`` runs: ``score_corpus(...).compute()`` on threads
  against ``score_docs`` with NumPy, on 200k names at the CLI's default chunk size;
- ``cluster``: ``score_corpus`` on a ``LocalCluster`` (2 processes x 1 thread) against
  ``score_docs`` with NumPy, at chunks of 8192 and 32768 documents.

Rounds interleave the two sides; the ratio (Dask time / NumPy time) is taken per round and
the median is reported with the range. Run from the repository root:

    python benchmarks/dask_targets.py [--rounds 5] [--json benchmarks/out/dask_targets.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import microgpt_xp as mx
from microgpt_xp.cli.eval import DEFAULT_EVAL_CHUNK
from microgpt_xp.cluster import connect
from microgpt_xp.scale import ShuffledRepeat, score_corpus, score_docs

ROOT = Path(__file__).resolve().parent.parent
NAMES = ROOT.parent / "shared" / "data" / "names.txt"


def _per_step(steps: int, **kwargs: Any) -> float:
    """Median seconds between consecutive steps of a ``train`` call (after 3 warm-up steps)."""
    stamps: list[float] = []
    mx.train(steps=steps, callback=lambda s, loss: stamps.append(time.perf_counter()), **kwargs)
    gaps = [b - a for a, b in itertools.pairwise(stamps)][3:]
    return statistics.median(gaps)


def _seconds(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _rounds(rounds: int, ours: Callable[[], float], base: Callable[[], float]) -> dict[str, Any]:
    ratios, ours_t, base_t = [], [], []
    for i in range(rounds):
        pair = [ours, base] if i % 2 == 0 else [base, ours]
        times = {id(f): f() for f in pair}
        ours_t.append(times[id(ours)])
        base_t.append(times[id(base)])
        ratios.append(ours_t[-1] / base_t[-1])
    return {
        "ratio_median": statistics.median(ratios),
        "ratio_range": [min(ratios), max(ratios)],
        "dask_s": statistics.median(ours_t),
        "numpy_s": statistics.median(base_t),
    }


def main() -> None:
    """Run the three comparisons and print (and optionally save) the figures."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    docs = mx.read_docs(NAMES) if NAMES.is_file() else mx.default_docs()
    tokenizer = mx.Tokenizer.from_docs(docs)
    out: dict[str, Any] = {}

    common = dict(docs=docs, dtype="float32", seed=0)
    for batch, chunk, steps in ((32, None, 60), (4096, 1024, 8)):
        name = f"train B={batch}" + (f" chunks {chunk}" if chunk else " one chunk")
        out[name] = _rounds(
            args.rounds,
            lambda b=batch, c=chunk, n=steps: _per_step(
                n, batch_size=b, backend="dask", chunk_size=c, **common
            ),
            lambda b=batch, n=steps: _per_step(n, batch_size=b, **common),
        )
        print(name, out[name], flush=True)

    params = mx.init_params(mx.GPTConfig(tokenizer.vocab_size), seed=0)
    corpus = list(ShuffledRepeat(tuple(docs), 200_000, seed=0).docs(0, 200_000))
    chunk = DEFAULT_EVAL_CHUNK
    name = f"eval 200k names, chunks of {chunk}, threads"
    out[name] = _rounds(
        args.rounds,
        lambda: _seconds(
            lambda: score_corpus(params, tokenizer, corpus, chunk_size=chunk).compute()
        ),
        lambda: _seconds(lambda: score_docs(params, tokenizer, corpus, chunk_size=chunk)),
    )
    print(name, out[name], flush=True)

    with connect(None, n_workers=2, threads_per_worker=1, processes=True, timeout=60):
        for chunk in (8192, 32768):
            name = f"score 200k names, chunks of {chunk}, LocalCluster 2x1"
            out[name] = _rounds(
                args.rounds,
                lambda c=chunk: _seconds(
                    lambda: score_corpus(params, tokenizer, corpus, chunk_size=c).compute()
                ),
                lambda c=chunk: _seconds(
                    lambda: score_docs(params, tokenizer, corpus, chunk_size=c)
                ),
            )
            print(name, out[name], flush=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
