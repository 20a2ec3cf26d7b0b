"""Benchmarks of microgpt_xp, outside the installed package, all timed by the harness of
:mod:`benchmarks.bench.timing`. From the repository root: ``python -m benchmarks.bench``
(ours against the peers, ``--ab DIR`` against another checkout), ``python -m
benchmarks.bench.report FILE.json``, ``python -m benchmarks.e2e workers|compiled|dask|threads|sample``
(whole library calls), ``bash benchmarks/run_all.sh`` and ``bash benchmarks/gpu_run.sh``.
Outputs go to ``benchmarks/out/`` (ignored by git); ``nox -s bench`` runs ``benchmarks/tests``.
"""
