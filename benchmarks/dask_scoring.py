"""Corpus scoring throughput and memory: NumPy vs Dask threads vs a LocalCluster.

Three ways to score the same corpus (``--n-docs`` names repeated and shuffled,
:class:`microgpt_xp.scale.ShuffledRepeat`) in chunks of 1k, 8k and 64k documents:

- ``numpy``: a Python loop over the chunks, each encoded and scored with NumPy
  (:func:`microgpt_xp.score`): the same work per chunk, no Dask;
- ``threads``: :func:`microgpt_xp.scale.score_corpus` on Dask's threaded scheduler;
- ``cluster``: the same graph on a ``LocalCluster`` of 2 worker processes x 1 thread.

Rounds interleave the three (the order rotates each round) and the ratios to NumPy are
taken per round, then the median. Around every measurement the machine-wide CPU counters
of ``/proc/stat`` and the CPU time of this process and of the workers are read; "other"
is the share of the machine that *other* processes used meanwhile, and rounds above
``--max-other`` are reported but left out of the medians.

Peak memory: each (way, corpus size) runs in a fresh subprocess, which reports its peak
RSS (``ru_maxrss``; for the cluster, the largest worker's and the client's).

    python benchmarks/dask_scoring.py                       # the figures in docs/dask.md
    python benchmarks/dask_scoring.py --n-docs 2000 --chunk-sizes 500 --rounds 1 --memory-docs ""
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

from microgpt_xp import GPTConfig, init_params, score
from microgpt_xp.data import Tokenizer, default_docs, encode_docs, read_docs
from microgpt_xp.params import Params
from microgpt_xp.scale import ShuffledRepeat, graph_stats, score_corpus

ROOT = Path(__file__).resolve().parent.parent
NAMES = ROOT.parent / "shared" / "data" / "names.txt"
WAYS = ("numpy", "threads", "cluster")
_TCK = os.sysconf("SC_CLK_TCK")


def blas_threads() -> int | None:
    """NumPy's BLAS threads (threadpoolctl); ``None`` when no BLAS library is found."""
    counts = [i["num_threads"] for i in threadpool_info() if i.get("user_api") == "blas"]
    return int(counts[0]) if counts else None


# -- CPU accounting ------------------------------------------------------------------------
def _machine() -> tuple[int, int]:
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    busy = v[0] + v[1] + v[2] + v[5] + v[6] + (v[7] if len(v) > 7 else 0)
    return busy, busy + v[3] + v[4]


def _proc_cpu(pid: int | str) -> int:
    """utime + stime jiffies of a process (all its threads)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return int(fields[11]) + int(fields[12])


def measure(fn: Callable[[], Any], pids: list[int]) -> dict[str, Any]:
    """Run ``fn`` once: wall seconds, CPU seconds of us and ``pids``, the share of the
    machine that other processes used meanwhile, and what ``fn`` returned."""
    own = ["self", *pids]
    b0, t0 = _machine()
    c0 = sum(_proc_cpu(p) for p in own)
    w0 = time.perf_counter()
    result = fn()
    wall = time.perf_counter() - w0
    b1, t1 = _machine()
    c1 = sum(_proc_cpu(p) for p in own)
    total = max(t1 - t0, 1)
    other = max(0.0, ((b1 - b0) - (c1 - c0)) / total)
    return {"wall": wall, "cpu": (c1 - c0) / _TCK, "other": other, "result": result}


# -- the three ways ---------------------------------------------------------------------------
def numpy_loop(params: Params, tok: Tokenizer, corpus: ShuffledRepeat, chunk: int) -> float:
    """The mean loss by a plain loop over the chunks (encode + score each with NumPy)."""
    total = 0.0
    for s in range(0, len(corpus), chunk):
        tokens, lengths = encode_docs(tok, corpus.docs(s, s + chunk), params.config.block_size)
        total += float(np.sum(np.asarray(score(params, tokens, lengths), dtype=np.float64)))
    return total / len(corpus)


def make_runner(
    way: str, params: Params, tok: Tokenizer, corpus: ShuffledRepeat, chunk: int, client: Any
) -> Callable[[], float]:
    if way == "numpy":
        return lambda: numpy_loop(params, tok, corpus, chunk)
    scheduler = "threads" if way == "threads" else client.get
    return lambda: (
        score_corpus(params, tok, corpus, chunk_size=chunk).compute(scheduler=scheduler).mean
    )


def setup(args: argparse.Namespace) -> tuple[Params, Tokenizer, list[str], str]:
    if args.data:
        base, source = read_docs(args.data), args.data
    elif NAMES.is_file():
        base, source = read_docs(NAMES), str(NAMES)
    else:
        base, source = default_docs(), "the embedded default corpus"
    tok = Tokenizer.from_docs(base)
    params = init_params(GPTConfig(tok.vocab_size), seed=0, dtype=args.dtype)
    return params, tok, base, source


def _cluster() -> Any:
    from microgpt_xp.cluster import connect

    return connect(None, n_workers=2, threads_per_worker=1, processes=True, timeout=120)


# -- peak memory (one fresh process per figure) ----------------------------------------------
def _status_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def reset_peak() -> float:
    """Reset this process's peak RSS (``VmHWM``) to its current RSS; returns that, in MB."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status_mb("VmRSS")


def peak_mb() -> float:
    """Peak RSS since the last :func:`reset_peak`, in MB."""
    return _status_mb("VmHWM")


def memory_probe(args: argparse.Namespace) -> None:
    way, n_docs, chunk = args.probe.split(",")
    params, tok, base, _ = setup(args)
    corpus = ShuffledRepeat(base, int(n_docs), seed=0)
    client = _cluster() if way == "cluster" else None
    runner = make_runner(way, params, tok, corpus, int(chunk), client)
    out: dict[str, Any] = {"way": way, "n_docs": int(n_docs), "chunk": int(chunk)}
    out["client_mb_before"] = reset_peak()
    if client is not None:
        out["worker_mb_before"] = max(client.run(reset_peak).values())
    t0 = time.perf_counter()
    out["mean"] = runner()
    out["wall"] = time.perf_counter() - t0
    out["client_mb"] = peak_mb()
    if client is not None:
        out["worker_mb"] = max(client.run(peak_mb).values())
        client.close()
    print(json.dumps(out), flush=True)


def run_memory(args: argparse.Namespace, sizes: list[int]) -> list[dict[str, Any]]:
    rows = []
    for way in ("threads", "cluster", "numpy"):
        for n in sizes:
            cmd = [
                sys.executable,
                __file__,
                "--probe",
                f"{way},{n},{args.memory_chunk}",
                "--dtype",
                args.dtype,
            ]
            if args.blas_threads is not None:
                cmd += ["--blas-threads", str(args.blas_threads)]
            if args.data:
                cmd += ["--data", args.data]
            proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
            row = json.loads(proc.stdout.strip().splitlines()[-1])
            rows.append(row)
            extra = ""
            if "worker_mb" in row:
                extra = f", largest worker {row['worker_mb']:.0f} MB (from {row['worker_mb_before']:.0f})"
            print(
                f"  {way:8s} {n:>9,} docs: client peak {row['client_mb']:.0f} MB (from "
                f"{row['client_mb_before']:.0f}){extra}; {row['wall']:.1f} s",
                flush=True,
            )
    return rows


# -- main --------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n-docs", type=int, default=100_000)
    p.add_argument("--chunk-sizes", default="1024,8192,65536")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-other", type=float, default=0.15, help="drop rounds above this share")
    p.add_argument("--memory-docs", default="100000,1000000", help="corpus sizes for peak RSS")
    p.add_argument("--memory-chunk", type=int, default=8192)
    p.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    p.add_argument("--data", default=None, help="base names (default: names.txt, else embedded)")
    p.add_argument(
        "--blas-threads", type=int, default=None, help="NumPy BLAS threads here (default: as is)"
    )
    p.add_argument("--json", default=None)
    p.add_argument("--probe", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.blas_threads is not None:
        threadpool_limits(limits=args.blas_threads, user_api="blas")
    if args.probe:
        memory_probe(args)
        return 0
    chunks = [int(c) for c in args.chunk_sizes.split(",") if c]
    params, tok, base, source = setup(args)
    corpus = ShuffledRepeat(base, args.n_docs, seed=0)
    print(
        f"corpus: {args.n_docs:,} documents from {source} ({len(base):,} base names), "
        f"{args.dtype}, {params.config}; {os.cpu_count()} CPUs, BLAS threads {blas_threads()}"
    )

    print("graph (mean and token mean; 'graph' = the model's layers as Dask tasks):")
    graphs = []
    for c in chunks:
        r = score_corpus(params, tok, corpus, chunk_size=c)
        g = score_corpus(params, tok, corpus, chunk_size=c, method="graph")
        st, sg = (
            graph_stats(params, r.mean, r.token_mean),
            graph_stats(params, g.mean, g.token_mean),
        )
        graphs.append(
            {
                "chunk": c,
                "chunks": r.num_chunks,
                "tasks": st.tasks,
                "weight_copies": st.weight_copies,
                "bytes": st.bytes,
                "graph_method_tasks": sg.tasks,
            }
        )
        print(
            f"  chunk {c:>6,}: {r.num_chunks:4d} chunks, {st.tasks:5d} tasks, weights {st.weight_copies}x, "
            f"{st.bytes / 1e3:.0f} kB pickled; method='graph': {sg.tasks} tasks"
        )

    client = _cluster()
    pids = list(client.run(os.getpid).values())
    # warm up: imports, first allocations, the workers' first tasks
    for way in WAYS:
        make_runner(way, params, tok, ShuffledRepeat(base, 4 * 1024, seed=1), 1024, client)()
    results: list[dict[str, Any]] = []
    means: dict[int, dict[str, float]] = {}
    for rnd in range(args.rounds):
        for c in chunks:
            order = WAYS[rnd % 3 :] + WAYS[: rnd % 3]
            row: dict[str, Any] = {"round": rnd, "chunk": c}
            for way in order:
                run = make_runner(way, params, tok, corpus, c, client)
                row[way] = measure(run, pids)
                means.setdefault(c, {})[way] = row[way].pop("result")
            row["other"] = max(row[w]["other"] for w in WAYS)
            results.append(row)
            print(
                f"  round {rnd} chunk {c:>6,}: "
                + ", ".join(
                    f"{w} {row[w]['wall']:.2f} s ({args.n_docs / row[w]['wall']:,.0f} docs/s, cpu {row[w]['cpu']:.1f} s)"
                    for w in WAYS
                )
                + f"; other {row['other']:.0%}",
                flush=True,
            )
    client.close()
    for m in means.values():  # the three ways compute the same mean
        assert max(m.values()) - min(m.values()) < 1e-5 * abs(m["numpy"]), m

    print(
        f"\nmedians over clean rounds (other <= {args.max_other:.0%}); ratio = time / NumPy's time"
    )
    summary = []
    for c in chunks:
        rows = [r for r in results if r["chunk"] == c]
        clean = [r for r in rows if r["other"] <= args.max_other] or rows
        line: dict[str, Any] = {
            "chunk": c,
            "rounds": len(rows),
            "clean": sum(r["other"] <= args.max_other for r in rows),
        }
        for w in WAYS:
            line[f"{w}_docs_per_s"] = statistics.median(args.n_docs / r[w]["wall"] for r in clean)
            line[f"{w}_cpu_us_per_doc"] = statistics.median(
                1e6 * r[w]["cpu"] / args.n_docs for r in clean
            )
        for w in ("threads", "cluster"):
            line[f"{w}_ratio"] = statistics.median(r[w]["wall"] / r["numpy"]["wall"] for r in clean)
        summary.append(line)
        print(
            f"  chunk {c:>6,} ({line['clean']}/{line['rounds']} clean): "
            + ", ".join(f"{w} {line[f'{w}_docs_per_s']:,.0f} docs/s" for w in WAYS)
            + f"; threads {line['threads_ratio']:.2f}x, cluster {line['cluster_ratio']:.2f}x"
        )

    sizes = [int(n) for n in args.memory_docs.split(",") if n]
    memory = []
    if sizes:
        print(f"\npeak memory, chunks of {args.memory_chunk:,} (fresh process each):")
        memory = run_memory(args, sizes)
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "n_docs": args.n_docs,
                    "source": source,
                    "dtype": args.dtype,
                    "graphs": graphs,
                    "rounds": results,
                    "summary": summary,
                    "memory": memory,
                },
                indent=2,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
