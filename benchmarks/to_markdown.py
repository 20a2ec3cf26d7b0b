"""Render a ``python -m benchmarks.bench --json`` result (schema 2) as the Markdown tables
of docs/performance.md.

python benchmarks/to_markdown.py benchmarks/out/results.json
"""

from __future__ import annotations

import json
import sys


def _si(x: float | None) -> str:
    if x is None:
        return "n/a"
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:.3g}"


def _r(x: float | None) -> str:
    if x is None:
        return "n/a"
    return f"{x:,.0f}x" if x >= 100 else f"{x:.2f}x"


def render(result: dict) -> str:
    m = result["machine"]
    out = [
        f"`{result['command']}` ({result['created']}): {m['cpu']}, {m['cpus']} CPUs, "
        f"NumPy {m['numpy']}, torch {m.get('torch')}, BLAS threads {m['blas_threads']}, "
        f"torch threads {m.get('torch_threads')}, malloc tuned: {m.get('malloc_tuned')}, "
        f"float32 1024x1024 matmul {m['square_matmul_gflops']:.0f} GFLOP/s"
        + "".join(
            f"; ours[{b}] on {d['ours']}, the torch peer on {d['torch_peer']}"
            for b, d in (m.get("devices") or {}).items()
            if d["ours"] != "cpu"
        )
        + ".",
        "",
        "| workload | config | B x T | dtype | ours / peer | ratio (median) | min-max | rounds kept/dropped | target |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in result["comparisons"]:
        t = c.get("target")
        verdict = (
            "" if t is None else f">= {_r(t)} {'**met**' if c['meets_target'] else '**missed**'}"
        )
        unf = "" if c["filtered"] else " (unfiltered)"
        out.append(
            f"| {c['workload']} | {c['config']} | {c['batch']}x{c['seq_len']} | {c['dtype']} | "
            f"{c['ours']} / {c['peer']} | {_r(c['ratio']['median'])} | {_r(c['ratio']['min'])}-"
            f"{_r(c['ratio']['max'])} | {c['rounds_kept']}/{c['rounds_dropped']}{unf} | {verdict} |"
        )
    out += [
        "",
        "| workload | config | B x T | impl | tokens/s (median) | min-max |",
        "|---|---|---|---|---|---|",
    ]
    for r in result["results"]:
        s = r["tokens_per_s"]
        out.append(
            f"| {r['workload']} | {r['config']} | {r['batch']}x{r['seq_len']} | {r['impl']} | "
            f"{_si(s['median'])} | {_si(s['min'])}-{_si(s['max'])} |"
        )
    for what in sorted({c["target_what"] for c in result["comparisons"] if c.get("target_what")}):
        out += ["", f"Target: {what}."]
    for c in result["comparisons"]:
        if c["peer"] == "matmul":
            out.append("")
            out.append(
                f"{c['workload']} {c['config']} B={c['batch']}: model matmuls "
                f"{c['model_flops_per_call'] / 1e9:.3f} GFLOP a call; ours "
                f"{c['ours_gflops']['median']:.1f} GFLOP/s, the same matmuls alone "
                f"{c['matmul_gflops']['median']:.1f} GFLOP/s."
            )
    for b in result["breakdown"]:
        if "rows" not in b:
            continue
        out += [
            "",
            f"Breakdown, {b['config']} B={b['batch']} T={b['seq_len']} {b['dtype']}: "
            f"{b['step_s'] * 1e3:.2f} ms a step under the profiler ({b['steps_kept']} steps "
            f"kept, {b['steps_dropped']} dropped; {b['minor_faults_per_step']:.0f} minor page "
            f"faults a step; {b['method']})",
            "",
            "| function | calls | own ms | inclusive ms | share |",
            "|---|---|---|---|---|",
        ]
        for r in b["rows"]:
            calls = "" if r["function"] == "other" else f"{r['calls']:.0f}"
            out.append(
                f"| {r['function']} | {calls} | {r['own_s'] * 1e3:.3f} | "
                f"{r['inclusive_s'] * 1e3:.3f} | {100 * r['share']:.1f}% |"
            )
    return "\n".join(out)


if __name__ == "__main__":
    for path in sys.argv[1:]:
        with open(path) as f:
            print(render(json.load(f)))
            print()
