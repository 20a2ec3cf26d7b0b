"""Dask training: one task per chunk, the weights in the graph once, NumPy's losses bit for bit
on threads and on a cluster (a lost worker included); no host pieces for other chunk types."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import numpy as np
import pytest

dask = pytest.importorskip("dask")
import dask.array as da  # noqa: E402
from dask.callbacks import Callback  # noqa: E402
from fakegpu import FakeGPU  # noqa: E402
from xp_testing import pickle_by_value  # noqa: E402

import microgpt_xp as mx  # noqa: E402
from microgpt_xp.data import encode_docs  # noqa: E402
from microgpt_xp.params import Params  # noqa: E402
from microgpt_xp.runners import DaskTasks  # noqa: E402
from microgpt_xp.train import add_pair, weighted_loss_and_grads  # noqa: E402

DOCS = mx.default_docs()[:300]
TOKENIZER = mx.Tokenizer.from_docs(DOCS)
CONFIG = mx.GPTConfig(TOKENIZER.vocab_size, n_layer=2, n_embd=8, n_head=2, block_size=12)
ARGS: dict[str, Any] = dict(steps=5, batch_size=40, seed=4, dtype="float64", config=CONFIG)


# -- the graph of a step ---------------------------------------------------------------------
@pytest.mark.parametrize(("chunk_size", "chunks"), [(None, 1), (40, 1), (8, 5), (16, 3)])
def test_a_step_is_one_task_per_chunk(chunk_size: int | None, chunks: int) -> None:
    params = mx.init_params(CONFIG, dtype="float64")
    tokens, lengths = encode_docs(TOKENIZER, DOCS[:40], CONFIG.block_size)
    totals = (len(lengths), int(np.minimum(lengths - 1, CONFIG.block_size).sum()))
    graph, (root,) = DaskTasks(chunk_size).graph(
        weighted_loss_and_grads, params, [tokens, lengths], "mean", *totals, combine=add_pair
    )
    # the weights, one task per chunk, and the chunks - 1 additions of the tree
    assert len(graph) == 2 * chunks
    holding = [k for k, v in graph.items() if isinstance(v, Params)]
    assert len(holding) == 1  # the weights are one key; the chunk tasks name it
    chunk_tasks = [v for v in graph.values() if isinstance(v, tuple) and holding[0] in v]
    assert len(chunk_tasks) == chunks
    assert root in graph


@pytest.mark.parametrize("reduction", ["mean", "token_mean"])
def test_dask_training_equals_numpy(reduction: str) -> None:
    ref = mx.train(DOCS, reduction=reduction, **ARGS)  # type: ignore[arg-type]
    one = mx.train(DOCS, backend="dask", reduction=reduction, **ARGS)  # type: ignore[arg-type]
    assert one.losses == ref.losses  # one chunk: NumPy's arithmetic, bit for bit
    chunked = mx.train(DOCS, backend="dask", chunk_size=8, reduction=reduction, **ARGS)  # type: ignore[arg-type]
    np.testing.assert_allclose(chunked.losses, ref.losses, rtol=1e-10, atol=0)
    again = mx.train(DOCS, backend="dask", chunk_size=8, reduction=reduction, **ARGS)  # type: ignore[arg-type]
    assert again.losses == chunked.losses
    assert mx._xp.backend_of(chunked.params.wte) == "dask"
    for name, a in chunked.params.arrays().items():
        np.testing.assert_allclose(
            np.asarray(a.compute()), getattr(ref.params, name), rtol=1e-9, atol=1e-12
        )


# -- a cluster of processes --------------------------------------------------------------------
distributed = pytest.importorskip("distributed")
from microgpt_xp.cluster import connect  # noqa: E402


def _chunk_tasks_seen(dask_scheduler: Any) -> int:
    """Training-chunk tasks the scheduler has seen (a plugin-free count of its log)."""
    return sum("microgpt-chunk" in str(msg) for msg in dask_scheduler.transition_log)


def test_a_cluster_trains_and_scores_as_threads_do_and_the_result_outlives_it() -> None:
    from microgpt_xp.corpus import ShuffledRepeat
    from microgpt_xp.scoring import score_docs

    pickle_by_value(__name__)
    params = mx.init_params(CONFIG, dtype="float64")
    corpus = ShuffledRepeat(tuple(DOCS), 6000, seed=1)

    def scores() -> Any:
        return score_docs(params, TOKENIZER, corpus, chunk_size=500, runner=DaskTasks(500))

    threads, scored = mx.train(DOCS, backend="dask", chunk_size=8, **ARGS), scores()
    with connect(None, n_workers=2, threads_per_worker=1, processes=True, timeout=60) as c:
        on_cluster = mx.train(DOCS, backend="dask", chunk_size=8, **ARGS)
        again = mx.train(DOCS, backend="dask", chunk_size=8, **ARGS)
        ran = c.run_on_scheduler(_chunk_tasks_seen)
        runs = [scores() for _ in range(3)]  # corpus means repeat bit for bit
    assert ran >= 2 * ARGS["steps"] * 5  # the chunk tasks did run on the cluster
    assert on_cluster.losses == threads.losses == again.losses
    assert {r.mean for r in runs} == {scored.mean}
    assert {r.token_mean for r in runs} == {scored.token_mean}
    # the client is closed: the weights are still there, and the model runs on them
    tokens, lengths = encode_docs(TOKENIZER, DOCS[:4], CONFIG.block_size)
    tok, lens = da.from_array(tokens), da.from_array(lengths)
    got = mx.score(on_cluster.params, tok, lens).compute()
    np.testing.assert_array_equal(got, mx.score(threads.params, tok, lens).compute())
    names = mx.sample(on_cluster.params, TOKENIZER, 6, chunks=3)
    assert names == mx.sample(threads.params.to("numpy"), TOKENIZER, 6)


def test_a_worker_lost_mid_training_does_not_change_the_losses() -> None:
    pickle_by_value(__name__)
    want = mx.train(DOCS, backend="dask", chunk_size=8, **{**ARGS, "steps": 8})
    with connect(None, n_workers=2, threads_per_worker=1, processes=True, timeout=60) as c:
        pids = list(c.run(os.getpid).values())

        def kill_one(step: int, loss: float) -> None:
            if step == 3:
                os.kill(pids[0], signal.SIGKILL)
                time.sleep(0.2)

        got = mx.train(
            DOCS, backend="dask", chunk_size=8, callback=kill_one, **{**ARGS, "steps": 8}
        )
        assert pids[0] not in c.run(os.getpid).values()
    assert got.losses == want.losses


# -- chunks of another array type ----------------------------------------------------------------
class _NoHostPieces(Callback):  # type: ignore[misc]
    """Fails a computation in which a task returns a NumPy array (not a scalar)."""

    def _posttask(self, key: Any, result: Any, dsk: Any, state: Any, worker_id: Any) -> None:
        for r in result if isinstance(result, tuple) else (result,):
            if isinstance(r, np.ndarray) and r.ndim > 0:
                raise AssertionError(f"task {key!r} made a NumPy array {r.shape} on the host")


def _on_fake_device(a: np.ndarray, chunks: Any) -> Any:
    a = np.asarray(a)
    meta = FakeGPU(np.empty((0,) * a.ndim, dtype=a.dtype))
    return da.from_array(FakeGPU(a), chunks=chunks, asarray=False, meta=meta)


def test_the_model_graph_keeps_the_chunks_type() -> None:
    params = mx.init_params(CONFIG, dtype="float64", seed=2)
    fake = params.map(lambda a: _on_fake_device(a, -1), check=False)
    tokens, lengths = encode_docs(TOKENIZER, DOCS[:6], CONFIG.block_size)
    tok, lens = _on_fake_device(tokens, (3, -1)), _on_fake_device(lengths, (3,))
    calls = {
        "forward": lambda p, t, n: mx.forward(p, t[:, :-1], n - 1),
        "score": mx.score,
        "grads": lambda p, t, n: mx.loss_and_grads(p, t, n)[1].wte,
    }
    results = {k: (f(fake, tok, lens), f(params, tokens, lengths)) for k, f in calls.items()}
    with dask.config.set(scheduler="synchronous"), _NoHostPieces():
        for name, (lazy, want) in results.items():
            assert isinstance(lazy._meta, FakeGPU), name
            got = lazy.compute()
            assert isinstance(got, FakeGPU), name
            np.testing.assert_allclose(got.get(), want, rtol=1e-12, atol=1e-15, err_msg=name)


def test_scoring_on_dask_tasks_is_one_graph_of_the_local_chunks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """score_docs on DaskTasks: one graph (one ``map``) of the local chunks, bit for bit."""
    from microgpt_xp.scoring import score_docs

    params = mx.init_params(CONFIG, dtype="float64")
    local = score_docs(params, TOKENIZER, DOCS, chunk_size=64)
    calls = []
    original = DaskTasks.map

    def counted(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(DaskTasks, "map", counted)
    tasks = score_docs(params, TOKENIZER, DOCS, chunk_size=64, runner=DaskTasks(64))
    assert calls == [1]
    assert np.array_equal(tasks.losses, local.losses) and tasks.mean == local.mean
