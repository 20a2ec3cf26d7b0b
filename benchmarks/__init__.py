"""Benchmarks of microgpt_xp, kept outside the installed package.

Run everything from the repository root, so that ``benchmarks`` is importable:

* ``python -m benchmarks.bench``: ours against the peers (the scalar reference, PyTorch eager,
  the plain matmuls), interleaved and filtered for other processes' load;
* ``python -m benchmarks.ab_variants A_DIR B_DIR``: A/B of two checkouts in one process;
* ``python -m benchmarks.gap_check``, ``python benchmarks/micro_ops.py``,
  ``python benchmarks/dask_scoring.py``, ``python benchmarks/exact_replay.py``: the
  measurements that docs/performance.md, docs/dask.md and docs/exact.md quote;
* ``bash benchmarks/run_all.sh`` and ``bash benchmarks/gpu_run.sh``: every figure in one go.

Outputs go to ``benchmarks/out/`` (ignored by git); docs/ keeps what it shows.
"""
