"""Score and sample a large batch on a Dask cluster, write the results, print the throughput.

The corpus is ``--n-docs`` documents made by repeating and shuffling a list of names
(``--data FILE``, default: the embedded corpus); each Dask task makes its own
``--chunk-size`` documents from that recipe (a :class:`ShuffledRepeat`) and scores them,
so no task and not this process holds the whole corpus. Then ``--n-samples`` names are
generated through the KV cache, one task a chunk, deterministically for ``--seed``. Both
are the library's one scoring and one sampling path on a :class:`DaskTasks` runner. By
default a ``LocalCluster`` of ``--workers`` worker processes (one thread each) runs it;
``--scheduler ADDRESS`` uses a running cluster and ``--threads`` Dask's threads here.
``--scores FILE`` / ``--names FILE`` write the per-document losses (``.npy`` or one per
line) and the names, atomically, once computed: a failed computation writes nothing.

    python examples/dask_batch.py --n-docs 1000000 --chunk-size 8192
    python examples/dask_batch.py --scheduler tcp://10.0.0.5:8786 --checkpoint model.npz
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from microgpt_xp import GPTConfig, init_params, sample
from microgpt_xp._files import atomic_write
from microgpt_xp.checkpoint import load
from microgpt_xp.cluster import connect
from microgpt_xp.corpus import ShuffledRepeat
from microgpt_xp.data import Tokenizer, default_docs, read_docs
from microgpt_xp.runners import DaskTasks
from microgpt_xp.scoring import score_docs


def write_scores(path: str | Path, losses: np.ndarray) -> None:
    """``losses`` to ``path`` atomically: ``.npy`` (``numpy.save``), else one per line."""
    if Path(path).suffix == ".npy":
        buf = io.BytesIO()
        np.save(buf, losses)
        atomic_write(path, buf.getvalue())
    else:
        atomic_write(path, "".join(f"{x:.9g}\n" for x in losses.tolist()))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n-docs", type=int, default=100_000, help="documents to score")
    p.add_argument("--chunk-size", type=int, default=8192, help="documents per task")
    p.add_argument("--n-samples", type=int, default=10_000, help="names to generate")
    p.add_argument("--data", default=None, help="names file (default: the embedded corpus)")
    p.add_argument("--checkpoint", default=None, help="weights (default: fresh, seeded)")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=2, help="LocalCluster worker processes")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--scheduler", default=None, help="address of a running scheduler")
    where.add_argument("--threads", action="store_true", help="Dask threads, no cluster")
    p.add_argument("--scores", default=None, help="write the per-document losses here")
    p.add_argument("--names", default=None, help="write the generated names here")
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
    runner = DaskTasks(args.chunk_size)
    chunks = -(-args.n_docs // args.chunk_size)

    cluster: Any = contextlib.nullcontext(None)
    if not args.threads:
        local = args.scheduler is None
        cluster = connect(
            args.scheduler,
            n_workers=args.workers if local else None,
            threads_per_worker=1 if local else None,
            timeout=60,
        )
    with cluster as client:
        where = "threads" if client is None else f"cluster {client.scheduler.address}"
        nworkers = 0 if client is None else len(client.scheduler_info(n_workers=-1)["workers"])
        print(
            f"scoring {args.n_docs:,} documents in {chunks} tasks on {where} ({nworkers} workers)"
        )
        t0 = time.perf_counter()
        summary = score_docs(params, tokenizer, corpus, chunk_size=args.chunk_size, runner=runner)
        score_s = time.perf_counter() - t0
        print(
            f"  mean loss {summary.mean:.4f} (per token {summary.token_mean:.4f}); "
            f"{score_s:.2f} s, {args.n_docs / score_s:,.0f} documents/s"
        )
        t0 = time.perf_counter()
        names = sample(params, tokenizer, args.n_samples, seed=args.seed, runner=runner)
        sample_s = time.perf_counter() - t0
        print(
            f"generated {args.n_samples:,} names: {sample_s:.2f} s, "
            f"{args.n_samples / sample_s:,.0f} samples/s; first: {', '.join(names[:5])}"
        )
    if args.scores:
        assert summary.losses is not None
        write_scores(args.scores, summary.losses)
    if args.names:
        atomic_write(args.names, "".join(f"{n}\n" for n in names))
    if args.json:
        report = {
            "n_docs": args.n_docs,
            "chunk_size": args.chunk_size,
            "chunks": chunks,
            "where": where,
            "workers": nworkers,
            "mean_loss": summary.mean,
            "token_mean_loss": summary.token_mean,
            "score_s": score_s,
            "score_docs_per_s": args.n_docs / score_s,
            "n_samples": args.n_samples,
            "sample_s": sample_s,
            "sample_per_s": args.n_samples / sample_s,
            "names": names[:20],
        }
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
