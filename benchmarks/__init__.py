"""Benchmarks of microgpt_xp, kept outside the installed package.

From the repository root (the ``-m`` entries import ``benchmarks``):

* ``python -m benchmarks.bench [options]``: ours against the peers (the scalar reference
  ``tests/reference.py``, PyTorch eager, the plain matmuls), interleaved rounds filtered for
  other processes' load, the targets of ``bench/targets.py``, a profile of our step;
* ``python -m benchmarks.ab_variants A_DIR B_DIR``: two checkouts A/B in one process;
* ``python -m benchmarks.gap_check``: ours against PyTorch with and without the idle gap;
* ``python benchmarks/micro_ops.py``, ``python benchmarks/dask_scoring.py``,
  ``python benchmarks/exact_replay.py``: the measurements that docs/performance.md,
  docs/dask.md and docs/exact.md quote; ``python benchmarks/to_markdown.py FILE.json``
  renders a ``--json`` result as those pages' tables;
* ``bash benchmarks/run_all.sh`` and ``bash benchmarks/gpu_run.sh``: the CPU and the GPU
  figures in one go.

Run outputs go to ``benchmarks/out/``, which git ignores; docs/ keeps what it shows.
"""
