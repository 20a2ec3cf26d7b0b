"""Benchmark: the whole `microgpt-xp train --microgpt-exact` command (1000 steps + 20
samples on names.txt) against the scalar reference's full run, as wall-clock seconds of
separate processes. Usage: python benchmarks/exact_replay.py [--repeats N] [--reference]

The scalar reference (tests/reference.py, the original's speed class) takes minutes, so it
runs once, only with --reference; the command runs --repeats times and the median is quoted.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NAMES = ROOT.parent / "shared" / "data" / "names.txt"


def wall(cmd: list[str]) -> float:
    """Seconds one command takes, its output discarded."""
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> None:
    """Time the command (median of repeats) and optionally the scalar reference once."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--reference", action="store_true", help="also time the scalar reference")
    args = ap.parse_args()
    exe = str(Path(sys.executable).with_name("microgpt-xp"))
    cmd = [exe, "train", "--microgpt-exact", "--data", str(NAMES)]
    wall(cmd)  # warm-up: page cache, .pyc files
    times = [wall(cmd) for _ in range(args.repeats)]
    med = statistics.median(times)
    print(
        f"microgpt-xp train --microgpt-exact: median {med:.2f} s over {args.repeats} runs "
        f"(min {min(times):.2f}, max {max(times):.2f})"
    )
    if args.reference:
        code = (
            "import sys; sys.path.insert(0, 'tests'); import reference as r; "
            f"r.run_microgpt(r.read_docs({str(NAMES)!r}), print_fn=lambda s: None)"
        )
        ref = wall([sys.executable, "-c", code])
        print(f"scalar reference, full run: {ref:.1f} s; ratio {ref / med:.0f}x")


if __name__ == "__main__":
    main()
