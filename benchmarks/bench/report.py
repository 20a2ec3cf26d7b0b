"""A benchmark result (a ``--json`` file) as the Markdown tables of docs/performance.md:
what ``python -m benchmarks.bench`` prints, and ``python -m benchmarks.bench.report
FILE.json ...`` prints again."""

from __future__ import annotations

import argparse
import json
import math
from typing import Any


def _si(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "n/a"
    scale, unit = next(((s, u) for s, u in ((1e6, "M"), (1e3, "k")) if abs(x) >= s), (1, ""))
    return f"{x / scale:.3g}{unit}"


def _r(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "n/a"
    return f"{x:,.0f}x" if x >= 100 else f"{x:.2f}x"


def _rows(header: str, rows: list[list[Any]]) -> list[str]:
    return ["", f"| {header} |", "|" + "---|" * header.count("|") + "---|"] + [
        "| " + " | ".join(str(c) for c in row) + " |" for row in rows
    ]


def render(result: dict[str, Any]) -> str:
    """The header line (command, machine), the ratios, the tokens/s, targets, skipped
    peers, the matmul yardstick in GFLOP/s and the breakdowns of our training step."""
    m = result["machine"]
    devices = "".join(
        f"; ours[{b}] on {d['ours']}, the torch peer on {d['torch_peer']}"
        for b, d in (m.get("devices") or {}).items()
        if d["ours"] != "cpu"
    )
    out = [
        f"`{result['command']}` ({result['created']}): {m['cpu']}, {m['cpus']} CPUs, "
        f"NumPy {m['numpy']}, torch {m.get('torch')}, BLAS threads {m['blas_threads']}, "
        f"torch threads {m.get('torch_threads')}, malloc tuned: {m.get('malloc_tuned')}, "
        f"float32 1024x1024 matmul {m['square_matmul_gflops']:.0f} GFLOP/s{devices}."
    ]
    rows = []
    for c in result["comparisons"]:
        t, r = c.get("target"), c["ratio"]
        verdict = (
            "" if t is None else f">= {_r(t)} {'**met**' if c['meets_target'] else '**missed**'}"
        )
        kept = f"{c['rounds_kept']}/{c['rounds_dropped']}" + (
            "" if c["filtered"] else " (unfiltered)"
        )
        rows.append(
            [
                c["workload"],
                c["config"],
                f"{c['batch']}x{c['seq_len']}",
                c["dtype"],
                f"{c['ours']} / {c['peer']}",
                _r(r["median"]),
                f"{_r(r['min'])}-{_r(r['max'])}",
                kept,
                verdict,
            ]
        )
    out += _rows(
        "workload | config | B x T | dtype | ours / peer | ratio (median) | min-max "
        "| rounds kept/dropped | target",
        rows,
    )
    rows = [
        [
            r["workload"],
            r["config"],
            f"{r['batch']}x{r['seq_len']}",
            r["impl"],
            _si(r["tokens_per_s"]["median"]),
            f"{_si(r['tokens_per_s']['min'])}-{_si(r['tokens_per_s']['max'])}",
        ]
        for r in result["results"]
    ]
    out += _rows("workload | config | B x T | impl | tokens/s (median) | min-max", rows)
    for what in sorted({c["target_what"] for c in result["comparisons"] if c.get("target_what")}):
        out += ["", f"Target: {what}."]
    if skipped := sorted(
        {f"{s['workload']} {s['config']} {s['peer']} ({s['reason']})" for s in result["skipped"]}
    ):
        out += ["", f"Skipped: {'; '.join(skipped)}."]
    out += [
        f"\n{c['workload']} {c['config']} B={c['batch']}: model matmuls {c['model_flops_per_call'] / 1e9:.3f} "
        f"GFLOP a call; ours {c['ours_gflops']['median']:.1f} GFLOP/s, the same matmuls alone "
        f"{c['matmul_gflops']['median']:.1f} GFLOP/s."
        for c in result["comparisons"]
        if c["peer"] == "matmul"
    ]
    for b in result["breakdown"]:
        if "rows" not in b:
            out += ["", f"Breakdown {b['config']}: {b['skipped']}."]
            continue
        out += [
            "",
            f"Breakdown, {b['config']} B={b['batch']} T={b['seq_len']} {b['dtype']} {b['backend']}: "
            f"{b['step_s'] * 1e3:.2f} ms a step under the profiler ({b['steps_kept']} steps kept, "
            f"{b['steps_dropped']} dropped; {b['minor_faults_per_step']:.0f} minor page faults a step; "
            f"{b['method']})",
        ]
        out += _rows(
            "function | calls | own ms | inclusive ms | share",
            [
                [
                    r["function"],
                    "" if r["function"] == "other" else f"{r['calls']:.0f}",
                    f"{r['own_s'] * 1e3:.3f}",
                    f"{r['inclusive_s'] * 1e3:.3f}",
                    f"{100 * r['share']:.1f}%",
                ]
                for r in b["rows"]
            ],
        )
        if b["upcasts"]:
            out += ["", f"Dtype changes in: {', '.join(b['upcasts'])} ({b['dtypes']})."]
    return "\n".join(out)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench.report", description=__doc__)
    ap.add_argument("files", nargs="+", metavar="FILE.json", help="written by bench --json")
    for path in ap.parse_args().files:
        with open(path) as f:
            print(render(json.load(f)), end="\n\n")
