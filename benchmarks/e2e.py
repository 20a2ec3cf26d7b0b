"""Whole library calls side by side, in the interleaved, filtered rounds of
:mod:`benchmarks.bench.timing` (ratios per round, then the median): ``python -m
benchmarks.e2e COMMAND``, one function each (its docstring says what it compares):
``workers``, ``compiled``, ``dask``, ``threads``, ``sample`` and ``stream``.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

import microgpt_xp as mx
from benchmarks.bench import checkout
from benchmarks.bench.timing import Figures, blas_threads, interleave, set_threads, summary
from benchmarks.bench.workloads import CONFIGS, parse_config
from microgpt_xp import resources as R

ROOT = Path(__file__).resolve().parent.parent
NAMES = ROOT.parent / "shared" / "data" / "names.txt"


def train_figures(steps: int, **kwargs: Any) -> dict[str, float]:
    """One ``mx.train(steps=steps, **kwargs)`` call: its ``total`` seconds, its
    ``first_step`` (with any compilation) and the median ``step`` after 3 warm-up steps
    (from the callback's timestamps)."""
    stamps: list[float] = []
    t0 = time.perf_counter()
    mx.train(steps=steps, callback=lambda s, loss: stamps.append(time.perf_counter()), **kwargs)
    total = time.perf_counter() - t0
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    return {
        "total": total,
        "first_step": stamps[0] - t0,
        "step": statistics.median(gaps[min(3, len(gaps) - 1) :]),
    }


def seconds(fn: Callable[[], Any]) -> dict[str, float]:
    """``{"s": wall seconds}`` of one call of ``fn``."""
    t0 = time.perf_counter()
    fn()
    return {"s": time.perf_counter() - t0}


def compare(
    label: str,
    contenders: dict[str, Callable[[], dict[str, float]]],
    args: argparse.Namespace,
    key: str = "s",
    pids: Sequence[int] = (),
) -> dict[str, Any]:
    """Interleaved rounds of ``contenders`` (name -> a call returning figures); prints and
    returns the medians of each figure, and the others' ``key`` over the first's (a time
    ratio: the first's speed-up over each) per round."""
    items = [Figures(name, fn) for name, fn in contenders.items()]
    rounds = interleave(
        items,
        args.rounds,
        max_rounds=args.max_rounds or args.rounds,
        max_other=args.max_other,
        pids=pids,
    )
    use, (base, *others) = rounds.use(), list(contenders)
    out: dict[str, Any] = {
        "rounds": rounds.measured,
        "other_share": rounds.other_share,
        "kept": rounds.kept,
    }
    for name in contenders:
        out[name] = {k: statistics.median(m[name][k] for m in use) for k in use[0][name]}
    for name in others:
        out[f"{name}/{base}"] = summary([m[name][key] / m[base][key] for m in use])
    lines = [f"{label} ({rounds.kept.count(True)} rounds kept, {rounds.dropped} dropped):"]
    lines += [
        f"  {name}: " + ", ".join(f"{k} {v:.4g}" for k, v in out[name].items())
        for name in contenders
    ]
    lines += [
        f"  {n} / {base} {key}: {r['median']:.3f} ({r['min']:.3f}-{r['max']:.3f})"
        for n, r in ((n, out[f"{n}/{base}"]) for n in others)
    ]
    print("\n".join(lines), flush=True)
    return out


def workers(args: argparse.Namespace) -> dict[str, Any]:
    """``train(workers=2)`` against ``train(workers=None)`` on NumPy, float32, embedded names."""
    docs, out = mx.default_docs(), {}
    for name, batch in (("default", 64), ("default", 1024), ("medium", 32), ("medium", 256)):
        steps = args.steps if name == "default" else max(args.steps // 4, 8)
        run = functools.partial(
            train_figures, steps, docs=docs, batch_size=batch, config=CONFIGS[name]
        )
        out[f"{name} B={batch}"] = compare(
            f"{name} B={batch}, {steps} steps",
            {"2 processes": lambda r=run: r(workers=2), "one process": run},
            args,
            key="step",
        )
    return out


def compiled(args: argparse.Namespace) -> dict[str, Any]:
    """JAX against NumPy: ``train`` and ``sample`` calls, compilation included."""
    out, parts = {}, args.parts.split(",")
    if "train" in parts:
        for name, steps in (("default", args.steps), ("medium", max(args.steps // 10, 20))):
            out[f"train {name}"] = compare(
                f"train {name} B=32, {steps} steps",
                {
                    b: functools.partial(
                        train_figures, steps, batch_size=32, backend=b, config=CONFIGS[name]
                    )
                    for b in ("numpy", "jax")
                },
                args,
                key="total",
            )
    if "sample" in parts:
        result = mx.train(mx.default_docs(), steps=50, batch_size=32, dtype="float32")
        on = {"numpy": result.params, "jax": result.params.to("jax")}

        def draw(backend: str) -> list[str]:
            jit = {"jit": args.jit} if backend == "jax" else {}
            return mx.sample(on[backend], result.tokenizer, args.samples, seed=1, **jit)

        out["sample"] = compare(
            f"sample {args.samples} names (jit={args.jit})",
            {b: functools.partial(seconds, functools.partial(draw, b)) for b in on},
            args,
        )
        print(
            "  each round:", [{b: round(m[b]["s"], 4) for b in m} for m in out["sample"]["rounds"]]
        )
        print("  same names on both:", draw("numpy") == draw("jax"), flush=True)
    return out


#: ``threads``: (config, batch, steps): the spec's model, a 2-layer 64-channel one, medium.
THREAD_CASES = (
    ("default", 32, 300),
    ("default", 64, 200),
    ("default", 1024, 20),
    ("L2,C64,H4,T36", 8, 100),
    ("L2,C64,H4,T36", 32, 50),
    ("L2,C64,H4,T36", 64, 30),
    ("medium", 32, 10),
)


def full_docs(block_size: int, n: int = 4096) -> list[str]:
    """``n`` random documents of ``block_size - 1`` letters: every batch is full length."""
    return [
        "".join(r)
        for r in np.random.default_rng(0).choice(
            list("abcdefghijklmnopqrstuvwxyz"), (n, block_size - 1)
        )
    ]


def on_threads(
    fn: Callable[..., dict[str, float]],
    n: int | str,
    cfg: mx.GPTConfig,
    batch: int,
    workload: str = "train",
    busy: bool = False,
) -> dict[str, float]:
    """``fn()`` in ``use_threads(n, ...)`` (``"auto"``: the load-aware policy's; recorded); ``busy``: beside a
    CPU-bound process of ours, reaped after (the harness counts its CPU time as ours)."""
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if busy else None
    time.sleep(0.3 if busy else 0.0)  # spinning before the work starts
    try:
        with R.use_threads(n, config=cfg, batch_size=batch, workload=workload) as n:
            return {**fn(**{"threads": n} if workload == "train" else {}), "threads": n}
    finally:
        if hog:
            hog.kill()
            hog.wait()


def threads(args: argparse.Namespace) -> dict[str, Any]:
    """Training steps on BLAS threads by the policy (the base), as today (every core) and
    on one, quiet and (``busy``) beside a CPU-bound process."""
    out = {}
    for spec, batch, steps in THREAD_CASES:
        label, cfg = parse_config(spec)
        run = functools.partial(
            train_figures,
            docs=full_docs(cfg.block_size),
            batch_size=batch,
            config=cfg,
            backend=args.backend,
        )
        ways: dict[str, int | str] = {"policy": "auto", "today": R.usable_cpus(), "1 thread": 1}
        contenders = {
            w: functools.partial(on_threads, functools.partial(run, steps), n, cfg, batch)
            for w, n in ways.items()
        }
        contenders |= {
            f"busy {w}": functools.partial(
                on_threads,
                functools.partial(run, max(8, steps // 4)),
                ways[w],
                cfg,
                batch,
                busy=True,
            )
            for w in ("policy", "today")
        }
        out[f"{label} B={batch}"] = compare(
            f"train {label} B={batch}", contenders, args, key="step"
        )
    return out


def sample(args: argparse.Namespace) -> dict[str, Any]:
    """Names/s of ``sample`` from ``--checkpoint`` by batch size and threads (``all`` cores,
    as today, or the ``policy``'s), in this checkout and in ``--ab DIR``'s; the first is the
    base. Same names from all?"""
    if (path := args.checkpoint) is None:
        raise SystemExit("python -m benchmarks.e2e sample: --checkpoint FILE is required")
    libs, names = (
        {"": mx} | ({"A ": importlib.import_module(checkout(args.ab))} if args.ab else {}),
        set(),
    )

    def draw(lib: Any, batch: int) -> dict[str, float]:
        ck, t0 = (
            importlib.import_module(f"{lib.__name__}.checkpoint").load(path),
            time.perf_counter(),
        )
        names.add(
            hash(tuple(lib.sample(ck.params, ck.tokenizer, args.samples, seed=1, batch_size=batch)))
        )
        return {"s": (s := time.perf_counter() - t0), "names_per_s": args.samples / s}

    cfg = importlib.import_module("microgpt_xp.checkpoint").load(path).config
    out = compare(
        f"sample {args.samples:,} names from {path}",
        {
            f"{tag}B={b} threads={t}": functools.partial(
                on_threads,
                functools.partial(draw, lib, b),
                "auto" if t == "policy" else R.usable_cpus() if t == "all" else int(t),
                cfg,
                min(b, args.samples),
                "decode",
            )
            for tag, lib in libs.items()
            for b in map(int, args.batch_sizes.split(","))
            for t in args.threads.split(",")
        },
        args,
    )
    print("  same names from all:", len(names) == 1, flush=True)
    return out | {"same_names": len(names) == 1}


#: ``stream``: nanoGPT's documented CPU model of Tiny Shakespeare (65 ids).
STREAM_CONFIG = mx.GPTConfig(65, n_layer=4, n_head=4, n_embd=128, block_size=64)


def stream(args: argparse.Namespace) -> dict[str, Any]:
    """Characters/s of one ``--length`` stream of text (``iter_samples(length=N)``, piece by
    piece as ``sample --length`` writes it) from random float32 weights of
    :data:`STREAM_CONFIG`, on the threads ``sample`` picks for one row; beside it nanoGPT's
    way, ``forward`` of the whole window (its last ``block_size`` ids) for every character."""
    from microgpt_xp.sample import choose, iter_samples

    tok = mx.Tokenizer([chr(i) for i in range(32, 32 + STREAM_CONFIG.vocab_size - 1)])
    params = mx.init_params(STREAM_CONFIG, seed=0, dtype="float32")

    def figures(t0: float, c0: float) -> dict[str, float]:  # CPU time: this thread's work
        s, cpu = time.perf_counter() - t0, time.process_time() - c0
        return {"s": s, "chars_per_s": args.length / s, "chars_per_cpu_s": args.length / cpu}

    def window() -> dict[str, float]:
        t0, c0 = time.perf_counter(), time.process_time()
        n = sum(len(piece) for piece in iter_samples(params, tok, 1, length=args.length, seed=1))
        assert n == args.length
        return figures(t0, c0)

    def whole_window() -> dict[str, float]:
        rng, ctx = np.random.default_rng(1), [tok.bos]
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(args.length):
            z = mx.forward(params, np.array([ctx[-STREAM_CONFIG.block_size :]]))[0, -1] * 2.0
            ctx.append(int(choose(np.exp(z - z.max())[None, :], rng.random(1))[0]))
        return figures(t0, c0)

    ways = {"window": window, "whole window each character": whole_window}
    n = R.default_threads(STREAM_CONFIG, 1, workload="decode")  # the command's choice
    return compare(
        f"stream {args.length:,} characters, L4 C128 H4 T64, float32, {n} thread(s)",
        {
            w: functools.partial(on_threads, fn, n, STREAM_CONFIG, 1, "decode")
            for w, fn in ways.items()
        },
        args,
    )


def rss_mb(reset: bool = False) -> float:
    """This process's peak RSS (``VmHWM``) in MB; ``reset=True`` first resets the peak to
    the current RSS and returns that."""
    if reset:
        Path("/proc/self/clear_refs").write_text("5")
    key = "VmRSS:" if reset else "VmHWM:"
    return next(
        int(ln.split()[1]) / 1024
        for ln in Path("/proc/self/status").read_text().splitlines()
        if ln.startswith(key)
    )


def _scorers(args: argparse.Namespace, client: Any) -> dict[str, Callable[[int], float]]:
    """The ways to score the corpus (each takes a chunk size, returns the mean loss)."""
    import dask

    from microgpt_xp.corpus import ShuffledRepeat
    from microgpt_xp.runners import DaskTasks
    from microgpt_xp.scoring import score_docs

    base = mx.read_docs(args.data or NAMES) if args.data or NAMES.is_file() else mx.default_docs()
    tok = mx.Tokenizer.from_docs(base)
    params = mx.init_params(mx.GPTConfig(tok.vocab_size), seed=0, dtype="float32")
    corpus = ShuffledRepeat(tuple(base), args.n_docs, seed=0)
    print(
        f"corpus: {len(corpus):,} documents from {len(base):,} names; BLAS threads {blas_threads()}"
    )

    def on(scheduler: Any, c: int) -> float:
        with dask.config.set(scheduler=scheduler):
            return score_docs(params, tok, corpus, chunk_size=c, runner=DaskTasks(c)).mean

    return {
        "numpy": lambda c: score_docs(params, tok, corpus, chunk_size=c).mean,
        "threads": lambda c: on("threads", c),
        "cluster": lambda c: on(client.get, c),
    }


def dask(args: argparse.Namespace) -> dict[str, Any]:
    """Dask against NumPy: training steps (``--train``), scoring, peak memory."""
    from microgpt_xp.cluster import connect

    if args.probe:  # one figure of the memory table, in this fresh process
        way, n, chunk = args.probe.split(",")
        args.n_docs = int(n)
        client = (
            connect(None, n_workers=2, threads_per_worker=1, processes=True, timeout=120)
            if way == "cluster"
            else None
        )
        ways = _scorers(args, client)
        row = {
            "way": way,
            "n_docs": int(n),
            "chunk": int(chunk),
            "client_mb_before": rss_mb(reset=True),
        }
        if client is not None:
            row["worker_mb_before"] = max(client.run(rss_mb, True).values())
        row.update(seconds(lambda: ways[way](int(chunk))), client_mb=rss_mb())
        if client is not None:
            row["worker_mb"] = max(client.run(rss_mb).values())
            client.close()
        print(json.dumps(row))
        return row
    out: dict[str, Any] = {"train": {}, "scoring": {}, "memory": []}
    if args.train:
        docs = mx.read_docs(NAMES) if NAMES.is_file() else mx.default_docs()
        for batch, chunk, steps in ((32, None, 60), (4096, 1024, 8)):
            run = functools.partial(
                train_figures, steps, docs=docs, batch_size=batch, dtype="float32", seed=0
            )
            out["train"][f"B={batch} chunks {chunk}"] = compare(
                f"train B={batch}, chunks of {chunk or batch}",
                {"numpy": run, "dask": lambda r=run, c=chunk: r(backend="dask", chunk_size=c)},
                args,
                key="step",
            )
    chunks = [int(c) for c in args.chunk_sizes.split(",") if c]
    with connect(None, n_workers=2, threads_per_worker=1, processes=True, timeout=120) as client:
        ways = _scorers(args, client)
        for way in ways.values():
            way(1024)  # warm-up: imports, first allocations, the workers' first tasks
        pids = list(client.run(os.getpid).values())
        for c in chunks:
            means: dict[str, float] = {}

            def run(way: str, c: int = c, means: dict[str, float] = means) -> dict[str, float]:
                t0 = time.perf_counter()
                means[way] = ways[way](c)
                return {"s": (s := time.perf_counter() - t0), "docs_per_s": args.n_docs / s}

            out["scoring"][c] = compare(
                f"scoring, chunks of {c:,}",
                {w: functools.partial(run, w) for w in ways},
                args,
                pids=pids,
            )
            assert max(means.values()) - min(means.values()) < 1e-5 * abs(means["numpy"]), means
    for way, n in itertools.product(
        ("threads", "cluster", "numpy"), [int(n) for n in args.memory_docs.split(",") if n]
    ):
        cmd = [
            sys.executable,
            "-m",
            "benchmarks.e2e",
            "dask",
            "--probe",
            f"{way},{n},{args.memory_chunk}",
        ]
        cmd += [] if args.data is None else ["--data", args.data]
        cmd += [] if args.blas_threads is None else ["--blas-threads", str(args.blas_threads)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT)
        out["memory"].append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(
            "peak memory (MB; the largest worker's for the cluster):", out["memory"][-1], flush=True
        )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv``, run the chosen measurement, write ``--json``."""
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.e2e", description=__doc__.split("\n\n")[0]
    )
    add = p.add_argument
    add("command", choices=["workers", "compiled", "dask", "threads", "sample", "stream"])
    add("--rounds", type=int, default=None, help="rounds kept (workers 5, else 3)")
    add("--max-rounds", type=int, default=None, help="rounds run at most (default: --rounds)")
    add("--max-other", type=float, default=0.15, help="drop rounds where others used more CPU")
    add("--json", default=None)
    add("--steps", type=int, default=None, help="training steps (workers 40, compiled 1000)")
    add("--parts", default="train,sample", help="compiled: train and/or sample")
    add("--samples", type=int, default=2000, help="compiled, sample: names to sample")
    add("--checkpoint", default=None, help="sample: the model")
    add("--ab", default=None, metavar="DIR", help="sample: also the microgpt_xp package of DIR")
    add("--batch-sizes", default="2000,500", help="sample: batch sizes")
    add("--threads", default="all,policy", help="sample: thread counts, 'all' or 'policy'")
    add("--length", type=int, default=2000, help="stream: characters of the stream")
    add("--backend", default="numpy", help="threads: the backend trained (torch: its threads too)")
    add("--jit", action=argparse.BooleanOptionalAction, default=None, help="compiled: JAX's sample")
    add("--train", action="store_true", help="dask: training steps too")
    add("--n-docs", type=int, default=100_000, help="dask: documents scored")
    add("--chunk-sizes", default="1024,8192,65536", help="dask: documents a chunk")
    add("--memory-docs", default="100000,1000000", help="dask: corpus sizes for peak RSS")
    add("--memory-chunk", type=int, default=8192)
    add("--data", default=None, help="dask: base names (default names.txt, else embedded)")
    add("--blas-threads", type=int, default=None, help="NumPy's BLAS threads here")
    add("--probe", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.rounds = args.rounds or (5 if args.command == "workers" else 3)
    args.steps = args.steps or (40 if args.command == "workers" else 1000)
    if args.blas_threads is not None:
        set_threads(args.blas_threads)
    out = {
        "workers": workers,
        "compiled": compiled,
        "dask": dask,
        "threads": threads,
        "sample": sample,
        "stream": stream,
    }[args.command](args)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
