"""Batches shared by host threads (``workers=``): the plan, and that threads change no
result beyond rounding (none at all for the same number of threads, or for sampling)."""

from __future__ import annotations

import multiprocessing
import os
import threading
from typing import Any

import numpy as np
import pytest
from conftest import SHARD_CFG, check_shards_match, shard_batch

from microgpt_xp import GPTConfig, _threads, init_params, loss_and_grads, score, train
from microgpt_xp.params import FIELDS
from microgpt_xp.sample import decode_batch, sample_tokens

CFG = SHARD_CFG


_batch = shard_batch


@pytest.fixture
def cpus(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Set the number of usable cores that the plans see."""

    def set_cpus(n: int) -> None:
        monkeypatch.setattr(_threads, "usable_cpus", lambda: n)

    return set_cpus


def test_plan_by_size(cpus: Any) -> None:
    cpus(2)
    default = GPTConfig(vocab_size=27)
    medium = GPTConfig(vocab_size=27, n_layer=4, n_embd=128, n_head=4, block_size=64)
    # the default model at batch 64 is too small to share: one thread, BLAS as it is
    assert _threads.plan(default, 64, 16, None) == _threads.Plan(1, None)
    assert _threads.plan(default, 1024, 16, None) == _threads.Plan(2, 1)
    assert _threads.plan(medium, 32, 64, None) == _threads.Plan(2, 1)
    # decoding: one position a row per call, so a larger batch is needed
    assert _threads.plan(default, 1024, 1, None) == _threads.Plan(1, None)
    assert _threads.plan(medium, 256, 1, None) == _threads.Plan(2, 1)
    # what loss_and_grads/score and decode_batch ask: documents of T+1 tokens, one position
    assert _threads.sequence_plan(medium, 32, 65, None) == _threads.plan(medium, 32, 64, None)
    assert _threads.sequence_plan(medium, 32, 99, None) == _threads.plan(medium, 32, 64, None)
    assert _threads.decode_plan(medium, 256, None) == _threads.plan(medium, 256, 1, None)
    cpus(8)
    assert _threads.plan(medium, 32, 64, None) == _threads.Plan(8, 1)
    assert _threads.plan(medium, 3, 64, None) == _threads.Plan(3, 2)  # one shard a row
    # explicit: that many threads (at most one a row), the cores shared by their BLAS
    assert _threads.plan(default, 64, 16, 4) == _threads.Plan(4, 2)
    assert _threads.plan(default, 2, 16, 4) == _threads.Plan(2, 4)
    assert _threads.plan(default, 64, 16, 1) == _threads.Plan(1, None)


def test_shard_bounds_cover_the_rows() -> None:
    assert _threads.shard_bounds(7, 3) == [(0, 2), (2, 4), (4, 7)]
    assert _threads.shard_bounds(2, 1) == [(0, 2)]


@pytest.mark.parametrize("workers", [0, -1, 1.5, "2", True])
def test_bad_workers(workers: Any) -> None:
    params = init_params(CFG, dtype="float64")
    tokens, lengths = _batch(4)
    with pytest.raises(ValueError, match="workers"):
        loss_and_grads(params, tokens, lengths, workers=workers)
    with pytest.raises(ValueError, match="workers"):
        sample_tokens(params, 10, 3, workers=workers)
    with pytest.raises(ValueError, match="workers"):
        train(["ab", "ba", "abc"], steps=1, batch_size=2, workers=workers)


@pytest.mark.parametrize("reduction", ["mean", "token_mean"])
@pytest.mark.parametrize("workers", [2, 3, 7, None])
def test_threads_give_the_single_thread_loss_and_grads(
    cpus: Any, reduction: str, workers: int | None
) -> None:
    cpus(3)
    params = init_params(CFG, seed=1, dtype="float64")
    tokens, lengths = _batch(7, seed=2)
    check_shards_match(params, tokens, lengths, reduction, workers)


def test_threads_keep_float32() -> None:
    params = init_params(CFG, dtype="float32")
    tokens, lengths = _batch(6)
    loss, grads = loss_and_grads(params, tokens, lengths, workers=3)
    assert loss.dtype == np.float32
    assert all(getattr(grads, name).dtype == np.float32 for name in FIELDS)


def test_shards_run_at_the_same_time(monkeypatch: pytest.MonkeyPatch) -> None:
    import microgpt_xp.model as M

    both = threading.Barrier(2, timeout=10)  # broken unless two shards wait at once
    seen: set[int] = set()
    nll = M._nll

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.add(threading.get_ident())
        both.wait()
        return nll(*args, **kwargs)

    monkeypatch.setattr(M, "_nll", spy)
    params = init_params(CFG, dtype="float64")
    loss_and_grads(params, *_batch(4), workers=2)
    assert len(seen) == 2 and threading.get_ident() not in seen


def test_a_batch_too_small_to_share_runs_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    import microgpt_xp.model as M

    checked: list[int] = []
    threads: set[int] = set()
    check, nll = M._check_tokens, M._nll

    def spy_check(*args: Any, **kwargs: Any) -> Any:
        checked.append(1)
        return check(*args, **kwargs)

    def spy_nll(*args: Any, **kwargs: Any) -> Any:
        threads.add(threading.get_ident())
        return nll(*args, **kwargs)

    monkeypatch.setattr(M, "_check_tokens", spy_check)
    monkeypatch.setattr(M, "_nll", spy_nll)
    params = init_params(CFG, dtype="float64")
    loss_and_grads(params, *_batch(4), workers=None)
    assert threads == {threading.get_ident()} and len(checked) == 1  # checked once, here
    with pytest.raises(ValueError, match="2-d"):
        loss_and_grads(params, np.zeros(7, dtype=np.int64), np.full(1, 7), workers=None)


def test_bad_token_is_named_by_its_row_in_the_batch() -> None:
    params = init_params(CFG, dtype="float64")
    tokens = np.random.default_rng(0).integers(0, CFG.vocab_size, (6, CFG.block_size + 1))
    lengths = np.full(6, CFG.block_size + 1)
    tokens[5, 3] = 42  # in the last thread's shard
    with pytest.raises(ValueError, match=r"token id 42 at \[5, 3\]"):
        loss_and_grads(params, tokens, lengths, workers=3)
    with pytest.raises(ValueError, match=r"token id 42 at \[5, 3\]"):
        score(params, tokens, lengths, workers=3)


def test_an_error_in_a_shard_is_raised_after_all_shards_ran() -> None:
    finished: list[int] = []

    def work(start: int, stop: int) -> int:
        if start == 0:
            raise RuntimeError("shard failed")
        finished.append(start)
        return start

    with pytest.raises(RuntimeError, match="shard failed"):
        _threads.run(_threads.Plan(3, 1), work, 6)
    assert sorted(finished) == [2, 4]


def test_blas_threads_are_restored(cpus: Any) -> None:
    from threadpoolctl import threadpool_info

    def blas() -> list[int]:
        return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]

    before = blas()
    seen: list[list[int]] = []
    _threads.run(_threads.Plan(2, 1), lambda a, b: seen.append(blas()), 4)
    assert seen and all(counts == [1] * len(before) for counts in seen)
    assert blas() == before


@pytest.mark.parametrize("workers", [2, 5, None])
def test_scores_and_samples_do_not_depend_on_threads(cpus: Any, workers: int | None) -> None:
    cpus(4)
    params = init_params(CFG, seed=3, dtype="float64")
    tokens, lengths = _batch(9, seed=4)
    np.testing.assert_allclose(
        score(params, tokens, lengths, workers=workers),
        score(params, tokens, lengths),
        rtol=1e-13,
    )
    uniforms = np.random.default_rng(5).random((300, CFG.block_size))
    want = decode_batch(params, 10, uniforms, 2.0)
    np.testing.assert_array_equal(decode_batch(params, 10, uniforms, 2.0, workers=workers), want)
    np.testing.assert_array_equal(
        sample_tokens(params, 10, 300, seed=6, workers=workers),
        sample_tokens(params, 10, 300, seed=6),
    )


def test_training_with_threads(cpus: Any) -> None:
    cpus(2)
    docs = [f"{a}{b}{c}" for a in "abcd" for b in "abcde" for c in "ab"]
    kw: dict[str, Any] = dict(steps=5, batch_size=8, dtype="float64", seed=1)
    one = train(docs, workers=1, **kw)
    two = train(docs, workers=2, **kw)
    again = train(docs, workers=2, **kw)
    np.testing.assert_allclose(two.losses, one.losses, rtol=1e-12)
    assert again.losses == two.losses
    np.testing.assert_allclose(two.params.wte, one.params.wte, rtol=1e-9, atol=1e-14)


def test_other_namespaces_ignore_workers(backend: Any) -> None:
    params = init_params(CFG, seed=1, backend=backend.name, device=backend.device, dtype="float64")
    tokens, lengths = _batch(4)
    tokens[tokens >= CFG.vocab_size] = 0  # lazy arrays check the padding's ids too
    tok, lens = backend.asarray(tokens), backend.asarray(lengths)
    want_loss, want = loss_and_grads(params, tok, lens)
    loss, grads = loss_and_grads(params, tok, lens, workers=2)
    np.testing.assert_allclose(backend.to_numpy(loss), backend.to_numpy(want_loss), rtol=1e-13)
    np.testing.assert_allclose(backend.to_numpy(grads.wte), backend.to_numpy(want.wte), rtol=1e-12)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_threads_work_in_a_forked_child() -> None:
    params = init_params(CFG, dtype="float64")
    tokens, lengths = _batch(4)
    want, _ = loss_and_grads(params, tokens, lengths, workers=2)
    # start every thread of the pool (each waits for all), so that none is idle to spare
    size = _threads._executor()._max_workers
    everyone = threading.Barrier(size, timeout=10)
    _threads.run(_threads.Plan(size, None), lambda a, b: everyone.wait(), size)
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(1) as pool:
        got = pool.apply_async(_child_loss, (params, tokens, lengths)).get(timeout=20)
    assert got == float(want)


def _child_loss(params: Any, tokens: np.ndarray, lengths: np.ndarray) -> float:
    return float(loss_and_grads(params, tokens, lengths, workers=2)[0])
