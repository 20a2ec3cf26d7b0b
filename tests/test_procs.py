"""Training batches shared by worker processes (``workers=None`` on Linux): the plan, and
that the processes change no result beyond rounding, report errors and recover."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import SHARD_CFG, check_shards_match, shard_batch

from microgpt_xp import GPTConfig, _procs, _threads, init_params, loss_and_grads
from microgpt_xp.params import FIELDS

pytestmark = pytest.mark.skipif(not _procs.available(), reason="worker processes need Linux")

CFG = SHARD_CFG
DEFAULT = GPTConfig(vocab_size=27)
MEDIUM = GPTConfig(vocab_size=27, n_layer=4, n_embd=128, n_head=4, block_size=64)


_batch = shard_batch


@pytest.fixture
def procs(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """``procs(n)``: plans see ``n`` usable cores and share even this test's tiny batches;
    every worker is stopped afterwards (a worker forked while a test patched the model
    keeps the patch)."""

    def setup(cpus: int) -> None:
        monkeypatch.setattr(_threads, "usable_cpus", lambda: cpus)
        monkeypatch.setattr(_procs, "MIN_PROCESS_WORK", 1)

    _procs.shutdown()
    yield setup
    _procs.shutdown()


def test_plan_by_size(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_threads, "usable_cpus", lambda: 2)
    # the default model's batch of 64 (524,288 multiply-adds) goes to two processes,
    # half of it (262,144) is too small to share
    assert _procs.plan(DEFAULT, 64, 17) == _threads.Plan(2, 1, processes=True)
    assert _procs.plan(DEFAULT, 32, 17).shards == 1
    assert _procs.plan(MEDIUM, 32, 65) == _threads.Plan(2, 1, processes=True)
    monkeypatch.setattr(_threads, "usable_cpus", lambda: 8)
    assert _procs.plan(MEDIUM, 32, 65).shards == 8
    assert _procs.plan(MEDIUM, 3, 65).shards == 3  # at most one a row


def test_only_automatic_training_on_numpy_takes_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    import microgpt_xp.model as M

    monkeypatch.setattr(_threads, "usable_cpus", lambda: 2)
    params = init_params(DEFAULT)
    tokens = np.zeros((64, 17), dtype=np.int64)
    assert M._host_plan(params, tokens, None, processes=True).processes
    # scoring (processes=False) and an explicit number of workers use threads
    assert not M._host_plan(params, tokens, None).processes
    assert not M._host_plan(params, tokens, 2, processes=True).processes
    assert M._host_plan(params, tokens, 1, processes=True) == _threads.UNCHANGED


@pytest.mark.parametrize("reduction", ["mean", "token_mean"])
def test_processes_give_the_single_process_loss_and_grads(procs: Any, reduction: str) -> None:
    procs(3)
    params = init_params(CFG, seed=1, dtype="float64")
    tokens, lengths = _batch(7, seed=2)
    check_shards_match(params, tokens, lengths, reduction, None)
    assert len(_procs.worker_pids()) == 2


def test_processes_keep_float32_and_grow_their_buffers(procs: Any) -> None:
    procs(2)
    small = init_params(CFG, dtype="float32")
    loss, grads = loss_and_grads(small, *_batch(4), workers=None)
    assert loss.dtype == np.float32
    assert all(getattr(grads, name).dtype == np.float32 for name in FIELDS)
    # a larger model and batch than the workers were made for
    big_cfg = GPTConfig(vocab_size=11, n_layer=3, n_embd=16, n_head=2, block_size=6)
    big = init_params(big_cfg, seed=2, dtype="float64")
    tokens, lengths = _batch(40, seed=3)
    want_loss, want = loss_and_grads(big, tokens, lengths)
    loss, grads = loss_and_grads(big, tokens, lengths, workers=None)
    assert float(loss) == pytest.approx(float(want_loss), rel=1e-13)
    np.testing.assert_allclose(grads.attn_wq, want.attn_wq, rtol=1e-12, atol=1e-15)


def test_shards_run_in_other_processes(
    procs: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import microgpt_xp.model as M

    nll = M._nll
    log = tmp_path / "pids"

    def spy(*args: Any, **kwargs: Any) -> Any:
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\n")
        return nll(*args, **kwargs)

    monkeypatch.setattr(M, "_nll", spy)
    procs(3)
    loss_and_grads(init_params(CFG, dtype="float64"), *_batch(6), workers=None)
    pids = [int(line) for line in log.read_text().split()]
    assert len(pids) == 3 and os.getpid() in pids
    assert sorted(set(pids) - {os.getpid()}) == sorted(_procs.worker_pids())


def test_an_error_in_a_worker_is_raised_here(procs: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import microgpt_xp.model as M

    nll, parent = M._nll, os.getpid()

    def failing(*args: Any, **kwargs: Any) -> Any:
        if os.getpid() != parent:
            raise FloatingPointError("in the worker")
        return nll(*args, **kwargs)

    monkeypatch.setattr(M, "_nll", failing)
    procs(2)
    params = init_params(CFG, dtype="float64")
    with pytest.raises(FloatingPointError, match="in the worker"):
        loss_and_grads(params, *_batch(4), workers=None)
    # the worker is still there and answers the next step
    with pytest.raises(FloatingPointError, match="in the worker"):
        loss_and_grads(params, *_batch(4), workers=None)


def test_a_dead_worker_is_replaced(procs: Any) -> None:
    procs(2)
    params = init_params(CFG, dtype="float64")
    want, _ = loss_and_grads(params, *_batch(4))
    loss_and_grads(params, *_batch(4), workers=None)
    (pid,) = _procs.worker_pids()
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while _procs.worker_pids() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _procs.worker_pids() == []
    loss, _ = loss_and_grads(params, *_batch(4), workers=None)
    assert float(loss) == pytest.approx(float(want), rel=1e-13)
    assert _procs.worker_pids() != [pid]


def test_a_worker_that_dies_in_a_step(procs: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import microgpt_xp.model as M

    nll, parent = M._nll, os.getpid()

    def dying(*args: Any, **kwargs: Any) -> Any:
        if os.getpid() != parent:
            os._exit(3)
        return nll(*args, **kwargs)

    monkeypatch.setattr(M, "_nll", dying)
    procs(2)
    params = init_params(CFG, dtype="float64")
    with pytest.raises(RuntimeError, match=r"worker process died \(exit code 3\)"):
        loss_and_grads(params, *_batch(4), workers=None)
    monkeypatch.setattr(M, "_nll", nll)  # the next worker is forked without the patch
    want, _ = loss_and_grads(params, *_batch(4))
    loss, _ = loss_and_grads(params, *_batch(4), workers=None)
    assert float(loss) == pytest.approx(float(want), rel=1e-13)


def test_bad_token_is_named_by_its_row_in_the_batch(procs: Any) -> None:
    procs(3)
    params = init_params(CFG, dtype="float64")
    tokens = np.random.default_rng(0).integers(0, CFG.vocab_size, (6, CFG.block_size + 1))
    tokens[5, 3] = 42  # in the last worker's shard
    with pytest.raises(ValueError, match=r"token id 42 at \[5, 3\]"):
        loss_and_grads(params, tokens, np.full(6, CFG.block_size + 1), workers=None)


def test_shutdown_stops_the_workers(procs: Any) -> None:
    procs(3)
    loss_and_grads(init_params(CFG, dtype="float64"), *_batch(6), workers=None)
    pids = _procs.worker_pids()
    assert len(pids) == 2
    _procs.shutdown()
    assert _procs.worker_pids() == []
    for pid in pids:
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, 0)  # reaped already


def test_a_daemonic_process_uses_threads_instead(procs: Any) -> None:
    procs(2)
    params = init_params(CFG, dtype="float64")
    tokens, lengths = _batch(4)
    want = float(loss_and_grads(params, tokens, lengths)[0])
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(1) as pool:  # pool workers are daemonic: they may not have children
        got, available = pool.apply_async(_child_loss, (params, tokens, lengths)).get(timeout=30)
    assert not available
    assert got == pytest.approx(want, rel=1e-13)


def _child_loss(params: Any, tokens: np.ndarray, lengths: np.ndarray) -> tuple[float, bool]:
    return float(loss_and_grads(params, tokens, lengths, workers=None)[0]), _procs.available()
