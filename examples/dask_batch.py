"""Score and sample a large batch on a Dask cluster, and print the throughput.

The corpus is ``--n-docs`` documents made by repeating and shuffling a list of names
(``--data FILE``, default: the embedded corpus), scored as one Dask computation of
``--chunk-size`` documents a chunk; then ``--n-samples`` names are generated through the
KV cache, in chunks, deterministically for ``--seed``. By default a ``LocalCluster`` of
``--workers`` worker processes (one thread each) runs it; ``--scheduler ADDRESS`` uses a
running cluster and ``--threads`` Dask's threaded scheduler in this process.

    python examples/dask_batch.py --n-docs 1000000 --chunk-size 8192
    python examples/dask_batch.py --scheduler tcp://10.0.0.5:8786 --checkpoint model.npz
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any

from microgpt_xp import GPTConfig, init_params
from microgpt_xp.checkpoint import load
from microgpt_xp.cluster import connect
from microgpt_xp.data import Tokenizer, default_docs, read_docs
from microgpt_xp.scale import (
    ShuffledRepeat,
    generate_names,
    graph_stats,
    score_corpus,
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n-docs", type=int, default=100_000, help="documents to score")
    p.add_argument("--chunk-size", type=int, default=8192, help="documents per chunk")
    p.add_argument("--n-samples", type=int, default=10_000, help="names to generate")
    p.add_argument("--data", default=None, help="names file (default: the embedded corpus)")
    p.add_argument("--checkpoint", default=None, help="weights (default: fresh, seeded)")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=2, help="LocalCluster worker processes")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--scheduler", default=None, help="address of a running scheduler")
    where.add_argument("--threads", action="store_true", help="Dask threads, no cluster")
    p.add_argument("--json", default=None, help="also write the figures to this JSON file")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    base = default_docs() if args.data is None else read_docs(args.data)
    if args.checkpoint is not None:
        saved = load(args.checkpoint, dtype=args.dtype)
        params = saved.params
        tokenizer = saved.tokenizer or Tokenizer.from_docs(base)
    else:
        tokenizer = Tokenizer.from_docs(base)
        params = init_params(GPTConfig(tokenizer.vocab_size), seed=args.seed, dtype=args.dtype)
    corpus = ShuffledRepeat(base, args.n_docs, seed=args.seed)

    if args.threads:
        cluster: Any = contextlib.nullcontext(None)
    else:
        cluster = connect(
            args.scheduler,
            n_workers=None if args.scheduler else args.workers,
            threads_per_worker=None if args.scheduler else 1,
            timeout=60,
        )
    with cluster as client:
        where = "threads" if client is None else f"cluster {client.scheduler.address}"
        nworkers = 0 if client is None else len(client.scheduler_info(n_workers=-1)["workers"])
        result = score_corpus(params, tokenizer, corpus, chunk_size=args.chunk_size)
        stats = graph_stats(params, result.mean, result.token_mean)
        print(
            f"scoring {args.n_docs:,} documents in {result.num_chunks} chunks of "
            f"{args.chunk_size:,} on {where} ({nworkers} workers); graph: {stats.tasks} tasks, "
            f"weights in it {stats.weight_copies}x"
        )
        t0 = time.perf_counter()
        summary = result.compute()
        score_s = time.perf_counter() - t0
        print(
            f"  mean loss {summary.mean:.4f} (per token {summary.token_mean:.4f}); "
            f"{score_s:.2f} s, {args.n_docs / score_s:,.0f} documents/s"
        )

        names = generate_names(
            params, tokenizer, args.n_samples, chunk_size=args.chunk_size, seed=args.seed
        )
        t0 = time.perf_counter()
        samples = [str(n) for n in names.compute()]
        sample_s = time.perf_counter() - t0
        print(
            f"generated {args.n_samples:,} names: {sample_s:.2f} s, "
            f"{args.n_samples / sample_s:,.0f} samples/s; first: {', '.join(samples[:5])}"
        )
    if args.json:
        report = {
            "n_docs": args.n_docs,
            "chunk_size": args.chunk_size,
            "chunks": result.num_chunks,
            "where": where,
            "workers": nworkers,
            "tasks": stats.tasks,
            "mean_loss": summary.mean,
            "token_mean_loss": summary.token_mean,
            "score_s": score_s,
            "score_docs_per_s": args.n_docs / score_s,
            "n_samples": args.n_samples,
            "sample_s": sample_s,
            "sample_per_s": args.n_samples / sample_s,
            "names": samples[:20],
        }
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
