"""``python -m benchmarks.bench``: training, scoring and decoding throughput (tokens/s) of
our code (:mod:`.workloads`) against its peers (:mod:`.peers`), in the same process and
the same interleaved rounds (:mod:`.timing`): ratios ours/peer per round, summarized over
the undisturbed rounds; the targets; where our training step's time goes (:mod:`.profiling`).
"""

from __future__ import annotations

import argparse
import atexit
import importlib.util
import json
import os
import platform
import re
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from microgpt_xp import __version__, _xp

from . import timing as T
from . import workloads as W
from .peers import PEERS, PeerSkipped, matmul_flops
from .profiling import breakdown

SCHEMA = "microgpt-xp-bench/2"
#: Batch sizes without ``--batch-size`` / ``--decode-batch-size`` (others: 32 and 256).
DEFAULT_BATCH = {"default": 64, "medium": 32, "text": 12}
DEFAULT_DECODE_BATCH = {"default": 1024, "medium": 256}


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _ints(text: str) -> list[int]:
    return [int(t) for t in _csv(text)]


def configure_parser(p: argparse.ArgumentParser) -> None:
    """Add the benchmark's options to ``p``."""
    add = p.add_argument
    add("--backend", default="numpy", help="our backends, comma-separated (default numpy)")
    add("--device", default=None, help="our arrays' device, e.g. 0 (cupy), cuda (torch)")
    add("--peer-device", default=None, help="the PyTorch peers' device (default: next to ours)")
    add("--dtype", default="float32", help="float32 and/or float64, comma-separated")
    add(
        "--config",
        default="default,medium",
        help=f"{', '.join(W.CONFIGS)} or specs like L2,C32,H4,T32 (';' before a spec after a config)",
    )
    add(
        "--workload",
        default=",".join(W.WORKLOADS),
        help=f"from {', '.join(W.WORKLOADS)} (text: its own config, batch 12 by default)",
    )
    add(
        "--batch-size",
        type=_ints,
        default=None,
        help="train/score/text batches (default 64 default, 12 text, 32 else)",
    )
    add(
        "--decode-batch-size",
        type=_ints,
        default=None,
        help="decode batches (1024 default, 256 else)",
    )
    add("--peers", default="scalar,torch,matmul", help=f"from {', '.join(PEERS)}, or none")
    add("--repeats", type=int, default=None, help="clean rounds wanted per case (7; --quick 3)")
    add("--max-rounds", type=int, default=None, help="most rounds per case (3x repeats)")
    add("--warmup", type=int, default=None, help="warm-up calls of each side (2; --quick 1)")
    add(
        "--min-time",
        type=float,
        default=None,
        help="seconds a measurement lasts (0.2; --quick 0.05)",
    )
    add("--gap", type=float, default=0.3, help="idle seconds before each measurement (0: none)")
    add(
        "--case-timeout",
        type=float,
        default=None,
        help="seconds of rounds per case (60; --quick 15)",
    )
    add(
        "--max-other",
        type=float,
        default=0.05,
        help="drop a round when other processes used more than this share of the CPUs",
    )
    add("--threads", type=int, default=None, help="BLAS and torch threads (default: BLAS as is)")
    add(
        "--tune-malloc",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="raise glibc's mmap/trim thresholds, as the microgpt-xp command does (default on)",
    )
    add("--no-breakdown", action="store_true", help="skip the profile of our training step")
    add("--quick", action="store_true", help="fewer and shorter rounds (a smoke run)")
    add("--json", default=None, metavar="FILE", help="write the result as JSON")
    add("--check-targets", action="store_true", help="exit 1 when a target is missed")
    add(
        "--ab",
        default=None,
        metavar="DIR",
        help="one more peer, 'A': our side run by the microgpt_xp package of DIR (A/B of a change)",
    )


def _configs(text: str) -> list[tuple[str, Any]]:
    """Configs separated by ``;``, or by ``,`` where no part of a spec (``C32``) follows."""
    return [
        W.parse_config(t.strip()) for t in re.split(r";|,(?![LCHTVlchtv]\d)", text) if t.strip()
    ]


def _machine(args: argparse.Namespace, backends: list[str]) -> dict[str, Any]:
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        cpu = platform.processor() or platform.machine()
    machine = {
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "platform": platform.platform(),
        "microgpt_xp": __version__,
        **T.set_threads(args.threads),
    }
    devices = {}
    for b in backends:
        dev = (
            W.Case("train", "default", W.CONFIGS["default"], 1, "float32", b, device=args.device)
            .params()
            .device
        )
        devices[b] = {
            "ours": str(dev),
            "torch_peer": args.peer_device or W.torch_device_like(b, dev),
        }
    machine["devices"] = devices
    machine["malloc_tuned"] = T.tune_malloc() if args.tune_malloc else False
    machine["square_matmul_gflops"] = T.square_matmul_gflops()
    return machine


def checkout(src: str) -> str:
    """Import ``src/microgpt_xp`` (another checkout's package) under a name of its own, from
    a copy removed at exit; returns that name."""
    if importlib.util.find_spec("jax"):  # each copy hooks JAX's import: the hooks would loop
        importlib.import_module("jax")
    scratch = Path(tempfile.mkdtemp(prefix="microgpt_ab_"))
    atexit.register(shutil.rmtree, scratch, True)
    shutil.copytree(
        Path(src) / "microgpt_xp",
        scratch / "microgpt_ab",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    sys.path.insert(0, str(scratch))
    importlib.import_module("microgpt_ab")
    return "microgpt_ab"


def _compare(
    case: W.Case,
    args: argparse.Namespace,
    peers: list[str],
    settings: dict[str, Any],
    out: dict[str, list[Any]],
) -> None:
    """Time ``case`` (ours and its peers, interleaved) and append to ``out``'s lists."""
    base = {
        "workload": case.workload,
        "config": case.config_name,
        "config_spec": W.config_label(case.config),
        "batch": case.batch,
        "seq_len": case.seq_len,
        "dtype": case.dtype,
        "backend": case.backend,
    }
    timed = [W.ours(case)]
    for peer in peers:
        try:
            timed.append(PEERS[peer](case))
        except PeerSkipped as skip:
            out["skipped"].append({**base, "peer": peer, "reason": str(skip)})
    if args.ab:
        timed.append(T.Timed("A", W.ours(case, args.ab_package).fn, case.tokens))
    print(
        f"[bench] {case.workload} {case.config_name} B={case.batch} {case.dtype} {case.backend}: "
        f"{', '.join(t.name for t in timed)}",
        file=sys.stderr,
        flush=True,
    )
    warm = {t.name: T.calibrate(t, settings["warmup"], settings["min_time_s"]) for t in timed}
    rounds = T.interleave(
        timed,
        settings["repeats"],
        max_other=args.max_other,
        max_rounds=args.max_rounds,
        deadline=time.perf_counter() + settings["case_timeout_s"],
        gap=args.gap,
    )
    kept, counts = (
        rounds.use(),
        {"rounds_kept": rounds.kept.count(True), "rounds_dropped": rounds.dropped},
    )
    for t in timed:
        out["results"].append(
            {
                **base,
                "impl": t.name,
                "tokens_per_call": t.tokens,
                "calls_per_round": t.repeat,
                "dtype_used": "float64" if t.name == "scalar" else case.dtype,
                "tokens_per_s": T.summary([t.tokens / m[t.name] for m in kept]),
                "seconds_per_call": T.summary([m[t.name] for m in kept]),
                "warmup_best_s": warm[t.name],
                **counts,
            }
        )
    mine = timed[0]
    for t in timed[1:]:
        ratios = [(mine.tokens / m[mine.name]) / (t.tokens / m[t.name]) for m in kept]
        target, ratio = W.target_for(case, t.name), T.summary(ratios)
        comp = {
            **base,
            "ours": mine.name,
            "peer": t.name,
            "ratio": ratio,
            "ratios": ratios,
            **counts,
            "filtered": rounds.filtered,
            "other_cpu_share": rounds.other_share,
            "target": target and target[0],
            "target_what": target and target[1],
            "meets_target": None if target is None else bool(ratio["median"] >= target[0]),
        }
        if t.name == "matmul":
            flops = matmul_flops(case)
            comp["model_flops_per_call"] = flops
            comp["ours_gflops"] = T.summary([flops / m[mine.name] / 1e9 for m in kept])
            comp["matmul_gflops"] = T.summary([flops / m["matmul"] / 1e9 for m in kept])
        out["comparisons"].append(comp)


def run_benchmarks(args: argparse.Namespace) -> dict[str, Any]:
    """Run the benchmark of parsed ``args``; the JSON-able result (``machine``,
    ``settings``, ``results``, ``comparisons``, ``skipped``, ``breakdown``, ...)."""
    q = args.quick
    settings = {
        "repeats": args.repeats or (3 if q else 7),
        "warmup": args.warmup if args.warmup is not None else (1 if q else 2),
        "min_time_s": args.min_time or (0.05 if q else 0.2),
        "gap_s": args.gap,
        "case_timeout_s": args.case_timeout or (15.0 if q else 60.0),
        "max_other_cpu_share": args.max_other,
        "quick": q,
        "peers": [] if args.peers.strip() == "none" else _csv(args.peers),
        "note": "every document is full length (T = block_size tokens); "
        "the scalar peer does one document per call in Python floats (float64)",
    }
    settings["max_rounds"] = args.max_rounds or 3 * settings["repeats"]
    backends = [_xp.check_backend(b) for b in _csv(args.backend)]
    dtypes = [_xp.check_dtype(d) for d in _csv(args.dtype)]
    workloads = _csv(args.workload)
    for names, known, what in (
        (workloads, W.WORKLOADS, "workload"),
        (settings["peers"], PEERS, "peer"),
    ):
        if unknown := [n for n in names if n not in known]:
            raise ValueError(f"unknown {what} {unknown[0]!r}; choose from {', '.join(known)}")
    if not args.gap >= 0:
        raise ValueError(f"--gap must be a number of seconds >= 0, got {args.gap}")
    configs = _configs(args.config)
    machine = _machine(args, backends)
    if args.ab:
        args.ab_package = checkout(args.ab)
    # each config with the workloads but text; then text, on its own config
    plan = [(n, c, [w for w in workloads if w != "text"]) for n, c in configs]
    plan += [("text", W.CONFIGS["text"], ["text"])] if "text" in workloads else []
    cases = [
        W.Case(
            w, cname, cfg, batch, dtype, backend, device=args.device, peer_device=args.peer_device
        )
        for cname, cfg, ws in plan
        for w in ws
        for batch in (
            (args.decode_batch_size or [DEFAULT_DECODE_BATCH.get(cname, 256)])
            if w == "decode"
            else (args.batch_size or [DEFAULT_BATCH.get(cname, 32)])
        )
        for dtype in dtypes
        for backend in backends
    ]
    out: dict[str, list[Any]] = {"results": [], "comparisons": [], "skipped": [], "breakdown": []}
    for case in cases:
        _compare(case, args, settings["peers"], settings, out)
    for case in [] if args.no_breakdown else [c for c in cases if c.trains]:
        print(
            f"[bench] breakdown {case.config_name} B={case.batch} {case.dtype} {case.backend}",
            file=sys.stderr,
        )
        bd = breakdown(case, steps=3 if q else 7, warmup=1 if q else 2, max_other=args.max_other)
        out["breakdown"].append(
            {
                "config": case.config_name,
                "batch": case.batch,
                "seq_len": case.seq_len,
                "dtype": case.dtype,
                "backend": case.backend,
                **bd,
            }
        )
    return {
        "schema": SCHEMA,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": args.argv,
        "machine": machine,
        "settings": settings,
        **out,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks.bench``: run, print the tables, write ``--json``. Returns 1
    with ``--check-targets`` when a target was missed, 2 for bad arguments."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench", description=__doc__.split("\n\n")[0]
    )
    configure_parser(parser)
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser.parse_args(argv)
    args.argv = shlex.join(["python", "-m", "benchmarks.bench", *argv])
    try:
        result = run_benchmarks(args)
    except (ValueError, ImportError) as exc:
        print(f"benchmarks.bench: error: {exc}", file=sys.stderr)
        return 2
    from .report import render  # here: ``python -m benchmarks.bench.report`` runs it as __main__

    print(render(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    return int(
        args.check_targets and any(c["meets_target"] is False for c in result["comparisons"])
    )
