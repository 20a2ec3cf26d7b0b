"""The printed table and the plot of a benchmark result (the dict that
:func:`benchmarks.bench.run_benchmarks` returns and ``--json`` writes)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any


def _si(x: float) -> str:
    if not math.isfinite(x):
        return "n/a"
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:.3g}"


def _ratio(x: float) -> str:
    if not math.isfinite(x):
        return "n/a"
    return f"{x:,.0f}x" if x >= 100 else f"{x:.2f}x"


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)
    ]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(out)


def format_report(result: dict[str, Any]) -> str:
    """The human-readable tables: machine, throughput per implementation, ratios per
    comparison (median of per-round ratios, with min-max), targets, and the breakdown."""
    m = result["machine"]
    lines = [
        f"machine: {m['cpu']} ({m['cpus']} CPUs), Python {m['python']}, NumPy {m['numpy']}, "
        f"torch {m.get('torch') or 'not installed'}",
        f"threads: BLAS {m['blas_threads']}, torch {m.get('torch_threads')}; "
        f"float32 1024x1024 matmul {m['square_matmul_gflops']:.1f} GFLOP/s; "
        f"malloc tuned: {'yes' if m.get('malloc_tuned') else 'no'}",
    ]
    for backend, dev in (m.get("devices") or {}).items():
        lines.append(
            f"devices: ours[{backend}] on {dev['ours']}, torch peer on {dev['torch_peer']}"
        )
    lines.append("")
    rows = []
    for r in result["results"]:
        tps = r["tokens_per_s"]
        rows.append(
            [
                r["workload"],
                r["config"],
                f"{r['batch']}x{r['seq_len']}",
                r["dtype"],
                r["impl"],
                _si(tps["median"]),
                f"{_si(tps['min'])}-{_si(tps['max'])}",
                f"{r['rounds_kept']}/{r['rounds_kept'] + r['rounds_dropped']}",
            ]
        )
    lines.append(
        _table(["workload", "config", "BxT", "dtype", "impl", "tokens/s", "min-max", "kept"], rows)
    )
    lines.append("")
    rows = []
    for c in result["comparisons"]:
        ratio = c["ratio"]
        target = c.get("target")
        verdict = "" if target is None else ("ok" if c["meets_target"] else "MISSED")
        rows.append(
            [
                c["workload"],
                c["config"],
                f"{c['batch']}x{c['seq_len']}",
                c["dtype"],
                f"{c['ours']} / {c['peer']}",
                _ratio(ratio["median"]),
                f"{_ratio(ratio['min'])}-{_ratio(ratio['max'])}",
                f"{c['rounds_kept']} kept, {c['rounds_dropped']} dropped"
                + ("" if c["filtered"] else " (unfiltered)"),
                "" if target is None else f">= {_ratio(target)} {verdict}",
            ]
        )
    lines.append(
        _table(
            [
                "workload",
                "config",
                "BxT",
                "dtype",
                "ours / peer",
                "ratio",
                "min-max",
                "rounds",
                "target",
            ],
            rows,
        )
    )
    for what in sorted({c["target_what"] for c in result["comparisons"] if c.get("target_what")}):
        lines.append(f"target: {what}")
    for s in result["skipped"]:
        lines.append(f"skipped: {s['workload']} {s['config']} {s['peer']}: {s['reason']}")
    for b in result["breakdown"]:
        lines.append("")
        if "skipped" in b:
            lines.append(f"breakdown {b['config']}: {b['skipped']}")
            continue
        lines.append(
            f"breakdown of our training step, {b['config']} B={b['batch']} T={b['seq_len']} "
            f"{b['dtype']} {b['backend']}: {b['step_s'] * 1e3:.2f} ms/step under the profiler "
            f"({b['steps_kept']} steps kept, {b['steps_dropped']} dropped; "
            f"{b['minor_faults_per_step']:.0f} minor page faults a step)"
        )
        lines.append(f"({b['method']})")
        rows = [
            [
                r["function"],
                "" if r["function"] == "other" else f"{r['calls']:.0f}",
                f"{r['own_s'] * 1e3:.3f}",
                f"{r['inclusive_s'] * 1e3:.3f}",
                f"{100 * r['share']:.1f}%",
            ]
            for r in b["rows"]
        ]
        lines.append(_table(["function", "calls", "own ms", "incl ms", "share"], rows))
        if b["upcasts"]:
            lines.append(f"dtype changes in: {', '.join(b['upcasts'])} ({b['dtypes']})")
    return "\n".join(lines)


_REST = "layers: the rest"


def _plot_rows(bds: list[dict[str, Any]], most: int = 10) -> list[str]:
    """The breakdown rows a plot shows: the ``most`` functions with the largest summed
    share, then the rest of them together, ``optim`` and ``other``."""
    last = ("optim", "other")
    total: dict[str, float] = {}
    for b in bds:
        for r in b["rows"]:
            if r["function"] not in last:
                total[r["function"]] = total.get(r["function"], 0.0) + r["share"]
    top = sorted(total, key=lambda k: -total[k])[:most]
    return [*top, *([_REST] if len(total) > most else []), *last]


def _share(b: dict[str, Any], name: str, shown: list[str]) -> float:
    """Share of the row ``name`` in breakdown ``b`` (``_REST``: the rows not in ``shown``)."""
    if name == _REST:
        return sum(r["share"] for r in b["rows"] if r["function"] not in shown)
    return sum(r["share"] for r in b["rows"] if r["function"] == name)


def plot(result: dict[str, Any], path: str | Path) -> None:
    """Save a figure: the per-round ratios of every comparison (median and min-max, log
    scale, targets marked) and, where measured, the breakdown of our training step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    comps = result["comparisons"]
    bds = [b for b in result["breakdown"] if "rows" in b]
    ncols = 1 + bool(bds)
    fig, axes = plt.subplots(
        1, ncols, figsize=(7 * ncols, 0.45 * max(len(comps), 6) + 1.5), squeeze=False
    )
    ax = axes[0][0]
    labels = [
        f"{c['workload']} {c['config']} {c['batch']}x{c['seq_len']} {c['dtype']}\n"
        f"{c['ours']} / {c['peer']}"
        for c in comps
    ]
    ys = list(range(len(comps)))
    med = [c["ratio"]["median"] for c in comps]
    lo = [c["ratio"]["median"] - c["ratio"]["min"] for c in comps]
    hi = [c["ratio"]["max"] - c["ratio"]["median"] for c in comps]
    colors = [
        "tab:gray" if c.get("target") is None else ("tab:green" if c["meets_target"] else "tab:red")
        for c in comps
    ]
    ax.barh(ys, med, xerr=[lo, hi], color=colors, alpha=0.8, capsize=3)
    for y, c in zip(ys, comps, strict=True):
        if c.get("target") is not None:
            ax.plot([c["target"]] * 2, [y - 0.4, y + 0.4], color="black", lw=2)
    ax.axvline(1.0, color="black", lw=0.5, ls=":")
    ax.set_xscale("log")
    ax.set_yticks(ys, labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("ours / peer tokens/s (median of per-round ratios; bar = min-max; | = target)")
    ax.set_title("Throughput ratios, interleaved rounds")
    if bds:
        ax2 = axes[0][1]
        names = _plot_rows(bds)
        left = [0.0] * len(bds)
        cmap = plt.get_cmap("tab20")
        for i, name in enumerate(names):
            vals = [100 * _share(b, name, names) for b in bds]
            ax2.barh(range(len(bds)), vals, left=left, color=cmap(i), label=name)
            left = [a + v for a, v in zip(left, vals, strict=True)]
        ax2.set_yticks(
            range(len(bds)),
            [f"{b['config']}\nB={b['batch']} {b['step_s'] * 1e3:.1f} ms" for b in bds],
            fontsize=8,
        )
        ax2.set_xlabel("share of our training step under cProfile (%)")
        ax2.set_title("Where our training step's time goes")
        ax2.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.15))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
