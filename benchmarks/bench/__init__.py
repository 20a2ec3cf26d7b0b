"""``python -m benchmarks.bench``: training, scoring and decoding throughput of our code against
its peers, measured so that the ratios can be trusted on a small shared machine.

Workloads (tokens/s, every document full length, ``T = block_size``):

* ``train``: one training step (forward, hand-written backward, Adam) on ``B`` documents;
* ``score``: the forward pass and the per-document loss of ``B`` documents;
* ``decode``: ``T`` positions of KV-cache decoding and sampling for ``B`` sequences at once.

Peers, timed in the same rounds as ours, interleaved (:mod:`.peers`): ``scalar``
(``tests/reference.py``, the tests' pure-Python oracle, one document at a time: scalar
autograd for ``train``, the original's speed class, and its float forward pass for
``score`` and ``decode``), ``torch`` (the same model in PyTorch eager, autograd and
``torch.optim.Adam``; ``torch_sdpa`` uses ``scaled_dot_product_attention``), and ``matmul``
(the step's matrix products alone: the machine's yardstick). Ours runs in this one
process. Ratios are ours/peer tokens/s per round; the report gives their median and spread
over the rounds that ``/proc/stat`` shows were not disturbed by other processes, the
targets of :mod:`.targets` (``--check-targets``), and where the time of our training step
goes (:mod:`.profiling`).

Run from the repository root as ``python -m benchmarks.bench [options]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import sys
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

import numpy as np

from microgpt_xp import __version__, _xp, init_params

from .peers import PEERS, PeerSkipped, make_peer, matmul_flops, square_matmul_gflops
from .profiling import breakdown
from .report import format_report, plot
from .targets import target_for
from .timing import (
    blas_threads,
    calibrate,
    interleave,
    set_blas_threads,
    summary,
    tune_malloc,
)
from .workloads import (
    CONFIGS,
    WORKLOADS,
    Case,
    config_label,
    device_name,
    ours,
    parse_config,
    torch_device_like,
)

__all__ = ["configure_parser", "main", "run", "run_benchmarks"]

#: Batch sizes used when ``--batch-size`` / ``--decode-batch-size`` are not given.
DEFAULT_BATCH = {"default": 64, "medium": 32}
DEFAULT_DECODE_BATCH = {"default": 1024, "medium": 256}

SCHEMA = "microgpt-xp-bench/2"


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def _ints(text: str) -> list[int]:
    try:
        values = [int(t) for t in _csv(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Add the ``bench`` options to ``parser`` (a subcommand's parser or a fresh one)."""
    parser.description = parser.description or __doc__.split("\n\n")[0]
    parser.add_argument(
        "--backend", default="numpy", help="our backends, comma-separated (default numpy)"
    )
    parser.add_argument(
        "--device",
        default=None,
        help="device of our arrays, e.g. 0 or cuda:0 (cupy), cuda (torch); "
        "default: the backend's default device",
    )
    parser.add_argument(
        "--peer-device",
        default=None,
        help="torch device of the PyTorch peers, e.g. cpu or cuda:0 "
        "(default: the same hardware as ours)",
    )
    parser.add_argument(
        "--dtype", default="float32", help="float32 and/or float64, comma-separated"
    )
    parser.add_argument(
        "--config",
        default="default,medium",
        help="configs: default (L1,C16,H4,T16), medium (L4,C128,H4,T64) or a "
        "spec like L2,C32,H4,T32 (comma-separated names; specs use ';')",
    )
    parser.add_argument(
        "--workload",
        default=",".join(WORKLOADS),
        help=f"workloads, comma-separated from {', '.join(WORKLOADS)}",
    )
    parser.add_argument(
        "--batch-size",
        type=_ints,
        default=None,
        help="train/score batch sizes, comma-separated (default: 64 for default, 32 otherwise)",
    )
    parser.add_argument(
        "--decode-batch-size",
        type=_ints,
        default=None,
        help="sequences decoded at once (default: 1024 for default, 256 otherwise)",
    )
    parser.add_argument(
        "--peers",
        default="scalar,torch,matmul",
        help=f"peers from {', '.join(PEERS)}, or none (default scalar,torch,matmul)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="clean rounds wanted per case (default 7; --quick 3)",
    )
    parser.add_argument(
        "--max-rounds",
        type=int,
        default=None,
        help="most rounds per case, clean or not (default 3x repeats)",
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=None,
        help="warm-up calls of each implementation (default 2; --quick 1)",
    )
    parser.add_argument(
        "--min-time",
        type=float,
        default=None,
        help="seconds one measurement lasts at least (default 0.2; --quick 0.05)",
    )
    parser.add_argument(
        "--gap",
        type=float,
        default=0.3,
        help="idle seconds before each measurement, so that the thread pools of the "
        "implementation measured before have gone to sleep (default 0.3; 0 = none)",
    )
    parser.add_argument(
        "--case-timeout",
        type=float,
        default=None,
        help="seconds of rounds per case before giving up on more clean ones "
        "(default 60; --quick 15)",
    )
    parser.add_argument(
        "--max-other",
        type=float,
        default=0.05,
        help="drop a round when other processes used more than this share of "
        "the CPUs during it (default 0.05)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="set NumPy's BLAS threads and torch's threads to N (default: leave BLAS as it "
        "is and give torch the same number)",
    )
    parser.add_argument(
        "--tune-malloc",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="raise glibc's mmap/trim thresholds for the whole process (ours and peers), "
        "as the microgpt-xp command does, so that step temporaries are reused instead of "
        "page-faulted in again (default: on)",
    )
    parser.add_argument(
        "--no-breakdown",
        action="store_true",
        help="skip the per-layer breakdown of our training step",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="fewer and shorter rounds (a smoke run, about a minute)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, metavar="FILE", help="write the results as JSON")
    parser.add_argument("--plot", default=None, metavar="FILE", help="save a plot (matplotlib)")
    parser.add_argument(
        "--check-targets",
        action="store_true",
        help="exit with status 1 when a measured target is missed (the targets are the "
        "table in benchmarks/bench/targets.py)",
    )


def _configs(text: str) -> list[tuple[str, Any]]:
    """Comma- or semicolon-separated configs; ``L4,C128`` parts of one spec stay together."""
    groups: list[str] = []
    for part in (p.strip() for p in text.replace(";", ",;,").split(",")):
        if not part:
            continue
        alone = part in CONFIGS or len(re.findall(r"[LCHTVlchtv]\d+", part)) != 1
        if part == ";" or alone or not groups or groups[-1] in CONFIGS or groups[-1] == ";":
            groups.append(part)
        else:
            groups[-1] += "," + part
    return [parse_config(g) for g in groups if g != ";"]


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _usable_cpus() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _setup_threads(threads: int | None) -> dict[str, Any]:
    info: dict[str, Any] = {}
    if threads is not None:
        info["blas_threads_set"] = set_blas_threads(threads)
    blas = blas_threads()
    info["blas_threads"] = blas
    try:
        import torch

        want = threads if threads is not None else blas
        if want is not None:
            torch.set_num_threads(int(want))
        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
    except ImportError:
        info["torch"] = None
        info["torch_threads"] = None
    return info


def run_benchmarks(args: argparse.Namespace, log: Any = None) -> dict[str, Any]:
    """Run the benchmark described by parsed ``args`` (see :func:`configure_parser`) and
    return the result as a JSON-able dict (``schema``, ``machine``, ``settings``,
    ``results``, ``comparisons``, ``skipped``, ``breakdown``). ``log`` (a callable taking a
    string) reports progress."""
    say = log or (lambda s: None)
    quick = bool(args.quick)
    repeats = args.repeats or (3 if quick else 7)
    warmup = args.warmup if args.warmup is not None else (1 if quick else 2)
    min_time = args.min_time if args.min_time is not None else (0.05 if quick else 0.2)
    case_timeout = args.case_timeout or (15.0 if quick else 60.0)
    backends = [_xp.check_backend(b) for b in _csv(args.backend)]
    dtypes = [_xp.check_dtype(d) for d in _csv(args.dtype)]
    workloads = _csv(args.workload)
    for w in workloads:
        if w not in WORKLOADS:
            raise ValueError(f"unknown workload {w!r}; choose from {', '.join(WORKLOADS)}")
    peers = [] if args.peers.strip() == "none" else _csv(args.peers)
    for p in peers:
        if p not in PEERS:
            raise ValueError(f"unknown peer {p!r}; choose from {', '.join(PEERS)} or none")
    configs = _configs(args.config)
    if not args.gap >= 0:
        raise ValueError(f"--gap must be a number of seconds >= 0, got {args.gap}")

    machine: dict[str, Any] = {
        "cpu": _cpu_name(),
        "cpus": os.cpu_count(),
        "usable_cpus": _usable_cpus(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "platform": platform.platform(),
        "microgpt_xp": __version__,
    }
    machine.update(_setup_threads(args.threads))
    device = getattr(args, "device", None)
    peer_device = getattr(args, "peer_device", None)
    machine["devices"] = {}
    for b in backends:
        dev = init_params(CONFIGS["default"], backend=b, device=device).device
        machine["devices"][b] = {
            "ours": device_name(b, dev),
            "torch_peer": peer_device or torch_device_like(b, dev),
        }
    machine["malloc_tuned"] = tune_malloc() if args.tune_malloc else False
    machine["square_matmul_gflops"] = square_matmul_gflops()

    cases: list[Case] = []
    for cname, cfg in configs:
        for workload in workloads:
            if workload == "decode":
                batches = args.decode_batch_size or [DEFAULT_DECODE_BATCH.get(cname, 256)]
            else:
                batches = args.batch_size or [DEFAULT_BATCH.get(cname, 32)]
            for batch in batches:
                for dtype in dtypes:
                    for backend in backends:
                        cases.append(
                            Case(
                                workload,
                                cname,
                                cfg,
                                batch,
                                dtype,
                                backend,
                                args.seed,
                                device,
                                peer_device,
                            )
                        )

    results: list[dict[str, Any]] = []
    comparisons: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    for case in cases:
        base = {
            "workload": case.workload,
            "config": case.config_name,
            "config_spec": config_label(case.config),
            "batch": case.batch,
            "seq_len": case.seq_len,
            "dtype": case.dtype,
            "backend": case.backend,
        }
        mine = ours(case)
        timed = [mine]
        for peer in peers:
            try:
                timed.append(make_peer(peer, case))
            except PeerSkipped as skip:
                skipped.append({**base, "peer": peer, "reason": str(skip)})
        say(
            f"{case.workload} {case.config_name} B={case.batch} {case.dtype} {case.backend}: "
            f"{', '.join(t.name for t in timed)}"
        )
        warm = {t.name: calibrate(t, warmup, min_time) for t in timed}
        rounds = interleave(
            timed,
            repeats,
            max_other=args.max_other,
            max_rounds=args.max_rounds,
            deadline=time.perf_counter() + case_timeout,
            gap=args.gap,
        )
        kept = rounds.kept_seconds()
        for t in timed:
            tps = [t.tokens / s[t.name] for s in kept]
            results.append(
                {
                    **base,
                    "impl": t.name,
                    "tokens_per_call": t.tokens,
                    "calls_per_round": t.repeat,
                    "dtype_used": "float64" if t.name == "scalar" else case.dtype,
                    "tokens_per_s": summary(tps),
                    "seconds_per_call": summary([s[t.name] for s in kept]),
                    "warmup_best_s": warm[t.name],
                    "rounds_kept": rounds.kept.count(True),
                    "rounds_dropped": rounds.dropped,
                }
            )
        for t in timed[1:]:
            ratios = [(mine.tokens / s[mine.name]) / (t.tokens / s[t.name]) for s in kept]
            target = target_for(case, t.name)
            ratio = summary(ratios)
            comp = {
                **base,
                "ours": mine.name,
                "peer": t.name,
                "ratio": ratio,
                "ratios": ratios,
                "rounds_kept": rounds.kept.count(True),
                "rounds_dropped": rounds.dropped,
                "filtered": rounds.filtered,
                "other_cpu_share": rounds.other_share,
                "target": None if target is None else target.minimum,
                "target_what": None if target is None else target.what,
                "meets_target": None if target is None else bool(ratio["median"] >= target.minimum),
            }
            if t.name == "matmul":
                flops = matmul_flops(case)
                comp["model_flops_per_call"] = flops
                comp["ours_gflops"] = summary([flops / s[mine.name] / 1e9 for s in kept])
                comp["matmul_gflops"] = summary([flops / s[t.name] / 1e9 for s in kept])
            comparisons.append(comp)

    breakdowns: list[dict[str, Any]] = []
    if not args.no_breakdown:
        for case in cases:
            if case.workload != "train":
                continue
            say(f"breakdown {case.config_name} B={case.batch} {case.dtype} {case.backend}")
            bd = breakdown(
                case,
                steps=3 if quick else 7,
                warmup=1 if quick else 2,
                max_other=args.max_other,
            )
            breakdowns.append(
                {
                    "config": case.config_name,
                    "batch": case.batch,
                    "seq_len": case.seq_len,
                    "dtype": case.dtype,
                    "backend": case.backend,
                    **bd,
                }
            )

    argv = getattr(args, "argv", None) or shlex.join(["python", "-m", "benchmarks.bench", *sys.argv[1:]])
    return {
        "schema": SCHEMA,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": argv,
        "machine": machine,
        "settings": {
            "repeats": repeats,
            "warmup": warmup,
            "min_time_s": min_time,
            "gap_s": args.gap,
            "max_rounds": args.max_rounds or 3 * repeats,
            "case_timeout_s": case_timeout,
            "max_other_cpu_share": args.max_other,
            "quick": quick,
            "seed": args.seed,
            "peers": peers,
            "note": "every document is full length (T = block_size tokens); "
            "the scalar peer does one document per call in Python floats (float64)",
        },
        "results": results,
        "comparisons": comparisons,
        "skipped": skipped,
        "breakdown": breakdowns,
    }


def _jsonable(x: Any) -> Any:
    if isinstance(x, float) and not np.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


def run(args: argparse.Namespace) -> int:
    """Run the benchmark with parsed ``args``: print the tables, write ``--json``
    and ``--plot``. Returns the exit status (1 with ``--check-targets`` when a target
    was missed, 2 for bad arguments)."""
    try:
        result = run_benchmarks(
            args, log=lambda s: print(f"[bench] {s}", file=sys.stderr, flush=True)
        )
    except (ValueError, ImportError) as exc:
        print(f"benchmarks.bench: error: {exc}", file=sys.stderr)
        return 2
    print(format_report(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(_jsonable(result), f, indent=1)
            f.write("\n")
    if args.plot:
        plot(result, args.plot)
    if args.check_targets and any(c["meets_target"] is False for c in result["comparisons"]):
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks.bench``: parse ``argv`` and :func:`run`."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench")
    configure_parser(parser)
    args = parser.parse_args(argv)
    args.argv = shlex.join(
        ["python", "-m", "benchmarks.bench", *(sys.argv[1:] if argv is None else argv)]
    )
    return run(args)
