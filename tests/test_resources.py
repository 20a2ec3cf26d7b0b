"""microgpt_xp.resources: thread counts (by size, by load for "auto", capped), ``use_threads``
setting and restoring limits, the activation formula and its chunks."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from threadpoolctl import threadpool_info, threadpool_limits
from xp_testing import raises_about

import microgpt_xp as mx
from microgpt_xp import GPTConfig
from microgpt_xp import resources as R
from microgpt_xp._xp import NATIVE_INT_MAX, check_positive_int
from microgpt_xp.scoring import score_docs

MP = pytest.MonkeyPatch
DEFAULT = GPTConfig(27)  # the spec's model: L1 C16 T16
TWO_LAYER = GPTConfig(27, n_layer=2, n_embd=64, n_head=4, block_size=36)
MEDIUM = GPTConfig(27, n_layer=4, n_embd=128, n_head=4, block_size=64)


def _blas_threads() -> set[int]:
    return {i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"}


def test_small_models_take_one_thread_without_sampling_the_load(monkeypatch: MP) -> None:
    monkeypatch.setattr(R, "busy_cpus", lambda *a: pytest.fail("sampled the load"))
    for config, batch in ((DEFAULT, 32), (DEFAULT, 64), (TWO_LAYER, 1), (TWO_LAYER, 2)):
        assert (
            R.auto_threads(config, batch, cpus=64) == 1 == R.default_threads(config, batch, cpus=64)
        )
    assert R.auto_threads(TWO_LAYER, 64, workload="decode", cpus=64) == 1  # one token a row
    assert R.auto_threads(DEFAULT, 2000, workload="decode", cpus=64) == 1


def test_bigger_work_takes_more_threads_up_to_the_free_cores(monkeypatch: MP) -> None:
    assert R.auto_threads(TWO_LAYER, 32, cpus=2, busy=0.0) == 2
    assert R.auto_threads(MEDIUM, 32, cpus=2, busy=0.0) == 2
    assert R.auto_threads(MEDIUM, 32, cpus=128, busy=0.0) == 64  # 2**25 of work: 64 threads' worth
    assert R.auto_threads(MEDIUM, 32, workload="score", cpus=128, busy=0.0) == 64
    assert R.auto_threads(TWO_LAYER, 8, cpus=2, busy=0.0) == 2  # 1.2M: the second thread pays
    counts = [R.auto_threads(TWO_LAYER, b, cpus=16, busy=0.0) for b in (1, 8, 32, 64, 256, 4096)]
    assert counts == sorted(counts) and counts[0] == 1 and counts[-1] == 16  # monotone, bounded
    # cores kept busy by other processes are not counted (rounded to the nearest core)
    assert R.auto_threads(MEDIUM, 32, cpus=2, busy=1.0) == 1
    assert R.auto_threads(MEDIUM, 32, cpus=2, busy=0.4) == 2
    assert R.auto_threads(MEDIUM, 32, cpus=8, busy=2.6) == 5
    assert R.auto_threads(MEDIUM, 32, cpus=2, busy=7.0) == 1  # never fewer than one
    # the default: the same choice, whatever the load (it never samples it)
    monkeypatch.setattr(R, "busy_cpus", lambda *a: pytest.fail("the default sampled the load"))
    assert [R.default_threads(TWO_LAYER, b, cpus=16) for b in (1, 8, 32, 64, 256, 4096)] == counts
    assert R.default_threads(MEDIUM, 32, cpus=8) == 8


def test_default_cpus_and_load_come_from_the_machine(monkeypatch: MP) -> None:
    assert 1 <= R.auto_threads(MEDIUM, 32) <= R.usable_cpus() <= (os.cpu_count() or 1)
    assert R.default_threads(MEDIUM, 32) == min(R.usable_cpus(), 64)
    monkeypatch.setattr(R, "busy_cpus", lambda *a: 1.0)
    assert R.auto_threads(MEDIUM, 32, cpus=2) == 1


BUSY = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass"


def test_busy_cpus_reads_the_other_processes() -> None:
    busy = R.busy_cpus(0.02)
    assert 0.0 <= busy <= (os.cpu_count() or 1)
    if Path("/proc/stat").exists():
        alone, with_self = R.cpu_sample(), R.cpu_sample([os.getpid()])
        assert alone and with_self and with_self.own > alone.own  # a given pid is ours too
        subprocess.run([sys.executable, "-c", BUSY], check=True)
        after = R.cpu_sample()  # so is a child's CPU time, once the child is waited for
        assert after and after.own - alone.own >= 0.25 * os.sysconf("SC_CLK_TCK")
    before = R.CpuSample(busy=1000, total=5000, own=100)
    # 200 jiffies of capacity, 60 busy of which 50 ours: 10 by others = 5 %
    assert R.other_cpu_share(before, R.CpuSample(1060, 5200, 150)) == pytest.approx(0.05)
    assert R.other_cpu_share(before, R.CpuSample(1050, 5200, 150)) == 0.0  # ours alone
    assert R.other_cpu_share(None, before) is None


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_bad_arguments(bad: object) -> None:
    with raises_about(ValueError, "threads"), R.use_threads(bad):  # type: ignore[arg-type]
        pass
    with pytest.raises(ValueError, match="batch_size"):
        R.auto_threads(DEFAULT, bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="budget"):
        R.chunk_for_budget(DEFAULT, budget_bytes=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="workload"):
        R.default_threads(DEFAULT, 1, workload="sample")
    with pytest.raises(ValueError, match="config"), R.use_threads("auto"):
        pass


def test_counts_that_become_native_ints_are_bounded() -> None:
    assert check_positive_int(NATIVE_INT_MAX, "runners", most=NATIVE_INT_MAX) == NATIVE_INT_MAX
    for huge in (2**31, 2**64):
        with raises_about(ValueError, "runners", f"at most {NATIVE_INT_MAX}, got {huge}"):
            check_positive_int(huge, "runners", most=NATIVE_INT_MAX)
        with pytest.raises(ValueError, match="cpus must be at most"):
            R.default_threads(DEFAULT, 1, cpus=huge)


@pytest.mark.parametrize("huge", [1_000_000, 2**31, 2**64])
def test_huge_thread_counts_are_capped_before_native_code(huge: int) -> None:
    with pytest.warns(UserWarning, match=f"threads={huge}"), R.use_threads(huge) as n:
        assert n == R.usable_cpus() and _blas_threads() == {n}


def test_use_threads_sets_and_restores_the_blas_limit() -> None:
    with threadpool_limits(limits=2, user_api="blas"):
        outer = _blas_threads()
        with R.use_threads(1) as n:
            assert n == 1 and _blas_threads() == {1}
        assert _blas_threads() == outer
        with pytest.raises(RuntimeError), R.use_threads(1):
            raise RuntimeError("restored on the way out")
        assert _blas_threads() == outer
        with R.use_threads("auto", config=DEFAULT, batch_size=32) as n:  # the policy's choice
            assert n == 1 and _blas_threads() == {1}
        assert _blas_threads() == outer
        with R.use_threads(None, config=MEDIUM, batch_size=32) as n:  # a library call: untouched
            assert n is None and _blas_threads() == outer


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="PyTorch is not installed")
def test_use_threads_sets_and_restores_torch_threads() -> None:
    import torch

    before = torch.get_num_threads()
    with R.use_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


def test_chunk_for_budget_is_monotone_and_within_the_budget() -> None:
    for config in (DEFAULT, TWO_LAYER, MEDIUM):
        budgets = (10**5, 10**7, 10**8, 5 * 10**8, 10**10)
        chunks = [R.chunk_for_budget(config, budget_bytes=b) for b in budgets]
        assert chunks == sorted(chunks)
        for b, c in zip((10**7, 10**8, 5 * 10**8), chunks[1:4], strict=True):
            assert R.activation_bytes(config, c) <= b < R.activation_bytes(config, c + 1)
    assert R.chunk_for_budget(MEDIUM, budget_bytes=1) == 1  # one document, whatever the budget
    sizes = [R.chunk_for_budget(c) for c in (DEFAULT, TWO_LAYER, MEDIUM)]  # bigger model, fewer
    assert sizes == sorted(sizes, reverse=True) and sizes[-1] < sizes[0]
    half = R.chunk_for_budget(TWO_LAYER, dtype="float64")
    assert abs(half - R.chunk_for_budget(TWO_LAYER) / 2) <= 1
    for config in (DEFAULT, TWO_LAYER, MEDIUM):  # the default chunk: fast, and within any budget
        assert R.score_chunk(config) <= R.chunk_for_budget(config)
        assert R.activation_bytes(config, R.score_chunk(config)) <= R.FAST_SCORE_BYTES
        low = R.chunk_for_budget(config, budget_bytes=10**6)
        assert R.score_chunk(config, budget_bytes=10**6) == low


@pytest.mark.parametrize(
    "config, docs",
    [(GPTConfig(27, n_layer=2, n_embd=32, n_head=4, block_size=24), 96), (GPTConfig(27), 256)],
)
def test_formula_bounds_the_allocations_of_scoring(config: GPTConfig, docs: int) -> None:
    """The formula within 10 % of tracemalloc's peak of scoring documents of full length."""
    rng = np.random.default_rng(0)
    tok = mx.Tokenizer("abcdefghijklmnopqrstuvwxyz")
    letters = list("abcdefghijklmnopqrstuvwxyz")
    text = ["".join(rng.choice(letters, config.block_size)) for _ in range(docs)]
    params = mx.init_params(config, seed=0, dtype="float32")
    score_docs(params, tok, text[:4], chunk_size=4)  # caches and imports first
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        score_docs(params, tok, text, chunk_size=docs)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    predicted = R.activation_bytes(config, docs)
    assert 0.9 * predicted <= peak <= 1.1 * predicted, (peak, predicted)
