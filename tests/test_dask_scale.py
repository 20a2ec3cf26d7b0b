"""Dask at scale: scoring and generation in Dask tasks, a tree-reduced gradient, a cluster of
worker processes (results, graph shape, faults) and the example, against NumPy's model."""

from __future__ import annotations

import functools
import gc
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("dask")
import dask
from xp_testing import pickle_by_value, xp_assert_close

from microgpt_xp import GPTConfig, Params, init_params, loss_and_grads, sample, score
from microgpt_xp.corpus import ShuffledRepeat
from microgpt_xp.data import DataError, Tokenizer, batch_indices, default_docs, encode_docs
from microgpt_xp.runners import DaskTasks
from microgpt_xp.sample import row_uniforms, sample_tokens
from microgpt_xp.scoring import score_docs, score_positions
from microgpt_xp.train import train

ROOT = Path(__file__).resolve().parent.parent
DOCS = default_docs()
TOKENIZER = Tokenizer.from_docs(DOCS)
CONFIG = GPTConfig(TOKENIZER.vocab_size)


@pytest.fixture(scope="module")
def params64() -> Params:
    return init_params(CONFIG, seed=3, dtype="float64")


@pytest.fixture(autouse=True)
def _threads() -> Iterator[None]:
    # in-process tests use Dask's threaded scheduler unless a test connects a client
    with dask.config.set(scheduler="threads"):
        yield


def _oracle(params: Params, docs: list[str]) -> tuple[np.ndarray, np.ndarray]:
    tokens, lengths = encode_docs(TOKENIZER, docs, CONFIG.block_size)
    return np.asarray(score(params, tokens, lengths)), np.minimum(lengths - 1, CONFIG.block_size)


def _on_tasks(params: Params, source: Any, chunk_size: int, **kwargs: Any) -> Any:
    runner = DaskTasks(chunk_size, **kwargs)
    return score_docs(params, TOKENIZER, source, chunk_size=chunk_size, runner=runner)


def _weight_copies(params: Params, corpus: Any, chunk_size: int, **kwargs: Any) -> tuple[int, int]:
    """``(tasks, copies of the weights' bytes)`` of the graph that scores ``corpus``."""
    import cloudpickle

    positions = np.arange(len(corpus))
    graph, _ = DaskTasks(chunk_size, **kwargs).graph(
        score_positions, params, [positions], corpus, TOKENIZER, chunk_size
    )
    marker = np.ascontiguousarray(params.wte).tobytes()
    blobs = [cloudpickle.dumps(task, protocol=5) for task in graph.values()]
    return len(graph), sum(marker in blob for blob in blobs)


# -- corpora ---------------------------------------------------------------------------------
def test_shuffled_repeat_follows_the_epoch_permutations() -> None:
    base = DOCS[:50]
    corpus = ShuffledRepeat(base, 170, seed=4)
    everything = corpus.docs(0, 170)
    assert len(everything) == len(corpus) == 170 and corpus.max_doc_len() == max(map(len, base))
    # batch_indices reads the same epochs: step k of size 10 is positions 10k..10k+9
    for k in range(17):
        want = [base[j] for j in batch_indices(len(base), 10, k, 4)]
        assert everything[10 * k : 10 * k + 10] == want
    # each epoch is a permutation of the base, and epochs differ
    for e in range(3):
        assert sorted(everything[50 * e : 50 * e + 50]) == sorted(base)
    assert everything[:50] != everything[50:100]
    # any split gives the same documents; ranges are clipped to the corpus
    assert corpus.docs(0, 37) + corpus.docs(37, 101) + corpus.docs(101, 500) == everything
    assert corpus.docs(170, 180) == []
    # shuffled repeat rejects bad arguments
    with pytest.raises(DataError, match="at least one base document"):
        ShuffledRepeat([], 10)
    with pytest.raises(DataError, match="positive"):
        ShuffledRepeat(["a"], 0)
    with pytest.raises(TypeError, match="int"):
        ShuffledRepeat(["a"], 2.5)  # type: ignore[arg-type]


# -- scoring -----------------------------------------------------------------------------------
@pytest.mark.parametrize("chunk_size", [1, 37, 5000])
def test_scoring_on_tasks_equals_numpy_on_the_whole_corpus(
    params64: Params, chunk_size: int
) -> None:
    docs = DOCS[:300] if chunk_size > 1 else DOCS[:40]
    got = _on_tasks(params64, docs, chunk_size)
    want, n = _oracle(params64, docs)
    assert got.losses is not None and got.num_predictions is not None
    xp_assert_close(got.losses, want, rtol=1e-12, like=params64.wte, elementwise=True)
    np.testing.assert_array_equal(got.num_predictions, n)
    assert got.losses.dtype == np.float64 and got.num_predictions.dtype == np.int64
    # the two corpus means are loss_and_grads' two batch losses (another code path)
    tokens, lengths = encode_docs(TOKENIZER, docs, CONFIG.block_size)
    mean, _ = loss_and_grads(params64, tokens, lengths, reduction="mean")
    token_mean, _ = loss_and_grads(params64, tokens, lengths, reduction="token_mean")
    assert got.mean == pytest.approx(float(mean), rel=1e-12)
    assert got.token_mean == pytest.approx(float(token_mean), rel=1e-12)
    assert got.num_docs == len(docs)


def test_virtual_corpora_chunking_and_the_graph(params64: Params) -> None:
    calls: list[tuple[int, int]] = []

    class Recording(ShuffledRepeat):
        def docs(self, start: int, stop: int) -> list[str]:
            calls.append((start, stop))
            return super().docs(start, stop)

    corpus = Recording(DOCS[:100], 1000, seed=2)
    got = _on_tasks(params64, corpus, 128)
    # every call produced one chunk, never the corpus
    assert sorted(calls) == [(s, min(s + 128, 1000)) for s in range(0, 1000, 128)]
    want, _ = _oracle(params64, ShuffledRepeat(DOCS[:100], 1000, seed=2).docs(0, 1000))
    assert got.losses is not None
    xp_assert_close(got.losses, want, rtol=1e-12, like=params64.wte, elementwise=True)
    # chunking keeps the result and the graph one weight copy
    corpus = ShuffledRepeat(DOCS, 2000, seed=5)
    runs = [_on_tasks(params64, corpus, c) for c in (97, 2000)]
    assert runs[0].losses is not None and runs[1].losses is not None
    xp_assert_close(runs[0].losses, runs[1].losses, rtol=1e-12, like=params64.wte, elementwise=True)
    assert runs[0].mean == pytest.approx(runs[1].mean, rel=1e-12)
    # graph holds the weights once and one task per chunk
    corpus = ShuffledRepeat(DOCS, 64 * 100, seed=0)
    for chunks in (4, 64):
        tasks, copies = _weight_copies(params64, corpus, len(corpus) // chunks)
        assert copies == 1 and tasks == chunks + 1
    # scoring float32 keeps a float64 mean
    p32 = init_params(CONFIG, seed=3, dtype="float32")
    docs = DOCS[:200]
    got = _on_tasks(p32, docs, 64)
    want, _ = _oracle(p32, docs)
    assert got.losses is not None
    # BLAS may round a float32 row differently with the number of rows (OpenBLAS on AVX2)
    xp_assert_close(got.losses.astype(np.float32), want, rtol=2e-6, like=p32.wte, elementwise=True)
    # the mean accumulates the float32 losses in float64
    assert got.mean == pytest.approx(float(np.mean(got.losses.astype(np.float64))), rel=1e-12)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [(lambda p: _on_tasks(p, DOCS[:10], 0), ValueError, "chunk_size"),
     (lambda p: _on_tasks(p, DOCS[:10], 2.0), ValueError, "chunk_size"),
     (lambda p: _on_tasks(p, DOCS[:10], 4, weights="copy"), ValueError, "weights"),
     (lambda p: _on_tasks(p, [], 4), DataError, "no documents"),
     (lambda p: _on_tasks(p, "abc", 4), TypeError, "source"),
     (lambda p: score_docs(p, Tokenizer("ab"), DOCS[:3], runner=DaskTasks(4)), ValueError,
      "tokenizer has"),
     # a bad document names its chunk
     (lambda p: _on_tasks(p, [*DOCS[:20], "hello!", *DOCS[20:40]], 8), DataError,
      r"documents 16\.\.23: .*'!'")],
)  # fmt: skip
def test_bad_arguments_and_sources(params64: Params, call: Any, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        call(params64)


@pytest.mark.parametrize("where", ["dask", "array_api_strict"])
def test_weights_or_chunks_on_another_backend(params64: Params, where: str) -> None:
    """Weights on Dask are copied once; chunks can run on another backend."""
    pytest.importorskip(where)
    if where == "dask":
        got = score_docs(params64.to("dask"), TOKENIZER, DOCS[:50], chunk_size=16)
    else:
        got = _on_tasks(params64.to(where), DOCS[:50], 16)
    want, _ = _oracle(params64, DOCS[:50])
    assert got.losses is not None
    xp_assert_close(got.losses, want, rtol=1e-12, like=params64.wte, elementwise=True)


# -- generation ---------------------------------------------------------------------------------
def test_row_uniforms_are_rows_of_one_stream_and_names_on_tasks_local(params64: Params) -> None:
    full = np.random.default_rng(11).random((50, 16))
    for start, stop in ((0, 50), (17, 33), (49, 50)):
        np.testing.assert_array_equal(row_uniforms(11, start, stop, 16), full[start:stop])
    # names on tasks are the local names
    names = sample(params64, TOKENIZER, 40, runner=DaskTasks(9), seed=1)
    ids = sample_tokens(params64, TOKENIZER.bos, 40, seed=1)
    assert names == [TOKENIZER.decode(r) for r in ids]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_tasks_sample_as_one_process_whatever_the_chunking(dtype: str) -> None:
    trained = train(DOCS, steps=30, batch_size=16, seed=0, dtype=dtype).params
    draw = functools.partial(sample_tokens, trained, TOKENIZER.bos, 300, temperature=0.7)
    want = draw(seed=9)
    for chunk_size in (1, 64, 300, 1000):
        ids = draw(seed=9, runner=DaskTasks(chunk_size))
        assert ids.shape == (300, CONFIG.block_size) and ids.dtype == np.int64
        np.testing.assert_array_equal(ids, want, err_msg=f"chunk size {chunk_size}")
    # another seed gives other samples
    assert not np.array_equal(draw(seed=10, runner=DaskTasks(64)), want)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"num_samples": 0}, "num_samples"), ({"temperature": 0.0}, "temperature"),
     ({"bos": 99}, "bos id"), ({"seed": -1}, "seed"), ({"chunks": -3}, "chunk")],
)  # fmt: skip
def test_sampling_on_dask_rejects_bad_arguments(
    params64: Params, kwargs: dict[str, Any], match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        sample_tokens(params64.to("dask"), **{"num_samples": 5, "bos": TOKENIZER.bos, **kwargs})


# -- data-parallel training --------------------------------------------------------------------
def test_a_gradient_is_reduced_over_the_chunks_in_a_tree() -> None:
    """Per-chunk partial products of a weight's gradient, combined in a tree (fan-in < 16)."""
    from dask.core import get_dependencies

    from microgpt_xp.train import to_batch

    p = init_params(CONFIG, seed=0, dtype="float64", backend="dask")
    tokens, lengths = encode_docs(TOKENIZER, DOCS[:64], CONFIG.block_size)
    _, grads = loss_and_grads(p, *to_batch(tokens, lengths, "dask", chunk_size=4))
    (g,) = dask.optimize(grads.lm_head)
    graph = dict(g.__dask_graph__())
    reducers = [k for k in graph if "partial" in str(k) or "aggregate" in str(k)]
    fan_in = [len(get_dependencies(graph, k)) for k in reducers]
    assert max(fan_in) < 16 and any(f > 1 for f in fan_in)


# -- a real cluster: LocalCluster with worker processes --------------------------------------
distributed = pytest.importorskip("distributed")
from microgpt_xp.cluster import ClusterError, connect  # noqa: E402


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    pickle_by_value(__name__)
    with connect(None, n_workers=2, threads_per_worker=1, processes=True, timeout=60) as c:
        yield c


def test_connect_starts_worker_processes_and_waits_for_them(client: Any, params64: Params) -> None:
    pids = client.run(os.getpid)
    assert len(pids) == 2 and os.getpid() not in pids.values()
    assert all(w["nthreads"] == 1 for w in client.scheduler_info(n_workers=-1)["workers"].values())
    # connect waits for workers
    with pytest.raises(ClusterError, match=r"has 2 worker\(s\) after 1 s; 3 needed"):
        connect(client.scheduler.address, min_workers=3, timeout=1)
    with connect(client.scheduler.address, min_workers=2, timeout=10) as other:
        assert len(other.scheduler_info(n_workers=-1)["workers"]) == 2
    # cluster generates like sample tokens
    with dask.config.set(scheduler="dask.distributed"):
        got = sample_tokens(params64, TOKENIZER.bos, 200, seed=2, runner=DaskTasks(50))
    np.testing.assert_array_equal(got, sample_tokens(params64, TOKENIZER.bos, 200, seed=2))


@pytest.mark.parametrize("weights", ["graph", "scatter"])
def test_cluster_scores_like_threads(client: Any, params64: Params, weights: str) -> None:
    corpus = ShuffledRepeat(DOCS, 3000, seed=1)
    want = _on_tasks(params64, corpus, 500)
    assert _weight_copies(params64, corpus, 500, weights=weights)[1] == (weights == "graph")
    with dask.config.set(scheduler="dask.distributed"):
        got = _on_tasks(params64, corpus, 500, weights=weights, client=client)
    assert got.losses is not None and want.losses is not None
    np.testing.assert_array_equal(got.losses, want.losses)
    assert got.mean == want.mean and got.token_mean == want.token_mean


def test_connect_errors_are_clear() -> None:
    t0 = time.perf_counter()
    reach = r"cannot reach the Dask scheduler at 'tcp://127\.0\.0\.1:1' within 1 s"
    with pytest.raises(ClusterError, match=reach) as unreachable:
        connect("tcp://127.0.0.1:1", timeout=1)
    assert time.perf_counter() - t0 < 15
    with pytest.raises(ValueError, match="invalid Dask scheduler address 'no-port'") as malformed:
        connect("no-port", timeout=1)
    with pytest.raises(ValueError, match="unknown address scheme"):
        connect("bogus://x:1", timeout=1)
    with pytest.raises(ValueError, match="cannot be given with a scheduler address"):
        connect("tcp://127.0.0.1:1", n_workers=2)
    with pytest.raises(ClusterError, match="scheduler file"):
        connect("/nonexistent/scheduler.json")
    with pytest.raises(ValueError, match="n_workers"):
        connect(None, n_workers=0)
    # a Client whose start failed is closed by connect(), not left to its __del__
    assert unreachable.value is not None and malformed.value is not None  # still held
    failed = [
        o for o in gc.get_objects() if isinstance(o, distributed.Client) and o.status != "running"
    ]
    assert all(o.status in ("closed", "newly-created") for o in failed), [o.status for o in failed]
    with connect(None, n_workers=1, threads_per_worker=1, processes=False) as fresh:
        assert fresh.submit(sum, [1, 2]).result() == 3


class SlowCorpus(ShuffledRepeat):
    """A corpus whose chunks take a known time, so that a fault lands mid-job."""

    delay: float = 0.15

    def docs(self, start: int, stop: int) -> list[str]:
        time.sleep(self.delay)
        return super().docs(start, stop)


def _chunks_done(dask_scheduler: Any) -> int:
    """Chunk tasks whose results the scheduler holds."""
    return sum(
        ts.state == "memory" and "microgpt-chunk" in str(ts.key)
        for ts in dask_scheduler.tasks.values()
    )


def test_a_killed_worker_does_not_change_the_result(params64: Params) -> None:
    pickle_by_value(__name__)
    corpus = SlowCorpus(DOCS, 40 * 200, seed=3)
    want = _on_tasks(params64, ShuffledRepeat(DOCS, 40 * 200, seed=3), 200)
    with connect(None, n_workers=2, threads_per_worker=1, processes=True, timeout=60) as c:
        got: list[Any] = []
        job = threading.Thread(target=lambda: got.append(_on_tasks(params64, corpus, 200)))
        job.start()
        deadline = time.monotonic() + 60
        while c.run_on_scheduler(_chunks_done) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert c.run_on_scheduler(_chunks_done) >= 4
        busy = [w for w, keys in c.processing().items() if keys]
        victim = busy[0]
        pid = c.run(os.getpid, workers=[victim])[victim]
        assert job.is_alive(), "the job ended before the fault"
        os.kill(pid, signal.SIGKILL)
        job.join()
        # the nanny started a new worker process in place of the killed one
        assert pid not in c.run(os.getpid).values()
    assert want.losses is not None
    np.testing.assert_array_equal(got[0].losses, want.losses)
    assert got[0].mean == want.mean and got[0].token_mean == want.token_mean


_SCHEDULER_SCRIPT = """
import time
from distributed import LocalCluster
cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=False, protocol="tcp",
                       dashboard_address=":0")
print(cluster.scheduler_address, flush=True)
time.sleep(600)
"""


def test_a_lost_scheduler_is_a_clear_error_and_writes_nothing(
    params64: Params, tmp_path: Path
) -> None:
    pickle_by_value(__name__)
    # the scheduler unpickles the graph, SlowCorpus included: let it import this module
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), *sys.path])}
    proc = subprocess.Popen(
        [sys.executable, "-c", _SCHEDULER_SCRIPT], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert proc.stdout is not None
        address = proc.stdout.readline().strip()
        with connect(address, timeout=5):
            killer = threading.Timer(1.0, proc.kill)
            killer.start()
            with pytest.raises(ClusterError, match=f"lost the Dask scheduler at {address}"):
                _on_tasks(params64, SlowCorpus(DOCS, 30 * 100, seed=0), 100)
            killer.join()
            assert list(tmp_path.iterdir()) == []
    finally:
        proc.kill()
        proc.wait(timeout=30)


# -- the example -------------------------------------------------------------------------------
def test_example_runs_small_and_writes_its_results(tmp_path: Path) -> None:
    out, scores, names = tmp_path / "run.json", tmp_path / "scores.npy", tmp_path / "names.txt"
    cmd = [sys.executable, str(ROOT / "examples" / "dask_batch.py"), "--n-docs", "3000"]
    cmd += ["--chunk-size", "500", "--n-samples", "300", "--workers", "2", "--json", str(out)]
    cmd += ["--scores", str(scores), "--names", str(names), "--dtype", "float64"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "documents/s" in proc.stdout and "samples/s" in proc.stdout
    report = json.loads(out.read_text())
    assert (report["n_docs"], report["chunks"]) == (3000, 6) and len(report["names"]) > 0
    assert report["score_docs_per_s"] > 0 and report["sample_per_s"] > 0
    assert 1.0 < report["mean_loss"] < 10.0
    params = init_params(CONFIG, seed=0, dtype="float64")
    want, _ = _oracle(params, ShuffledRepeat(DOCS, 3000, seed=0).docs(0, 3000))
    np.testing.assert_allclose(np.load(scores), want, rtol=1e-12, atol=0)
    assert names.read_text().splitlines() == sample(params, TOKENIZER, 300, seed=0)
