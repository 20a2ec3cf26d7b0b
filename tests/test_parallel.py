"""Worker processes (``Processes(N)``, ``workers=N``): one process's results, clear errors, no
process left behind whatever happens to a worker or to the parent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from xp_testing import xp_assert_close

import microgpt_xp as mx
from microgpt_xp.params import FIELDS
from microgpt_xp.runners import Processes, shard_bounds
from microgpt_xp.runners.processes import WorkerPool

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX process tests")

DOCS = mx.default_docs()[:400]
TOKENIZER = mx.Tokenizer.from_docs(DOCS)
CONFIG = mx.GPTConfig(TOKENIZER.vocab_size, n_layer=2, n_embd=8, n_head=2, block_size=8)


def _pid(params: Any, rows: np.ndarray) -> list[int]:
    """A shard function: the process that ran it, once per row."""
    return [os.getpid()] * len(rows)


def _fail_on_negative(params: Any, rows: np.ndarray) -> int:
    if (rows < 0).any():
        raise ValueError(f"negative row in a shard of {len(rows)}")
    return len(rows)


def _sleep(params: Any, rows: np.ndarray, seconds: float) -> int:
    time.sleep(seconds)
    return len(rows)


RUN: dict[str, Any] = dict(steps=4, batch_size=24, config=CONFIG, dtype="float64", seed=3)


def _run_train(workers: int | None, reduction: str = "mean") -> mx.TrainResult:
    return mx.train(DOCS, reduction=reduction, workers=workers, **RUN)


@pytest.mark.parametrize("workers", [0, -1, 1.5, True, "2"])
def test_bad_workers_are_refused(workers: Any) -> None:
    with pytest.raises(ValueError, match="workers"):
        mx.train(DOCS, steps=1, workers=workers)
    with pytest.raises(ValueError, match="workers"):
        mx.sample(mx.init_params(CONFIG), TOKENIZER, 2, workers=workers)


def test_processes_and_the_backend_are_two_choices() -> None:
    """Processes spread the rows; the weights stay on the backend (here array-api-strict)."""
    strict = pytest.importorskip("array_api_strict")
    args = {**RUN, "steps": 2}
    one = mx.train(DOCS, backend="array_api_strict", **args)
    with Processes(2) as runner:
        two = mx.train(DOCS, backend="array_api_strict", runner=runner, **args)
        want = mx.sample(two.params, TOKENIZER, 6)
        assert mx.sample(two.params, TOKENIZER, 6, runner=runner) == want
    assert two.params.xp is strict
    np.testing.assert_allclose(two.losses, one.losses, rtol=1e-12)
    with pytest.raises(ValueError, match=r"workers cannot be given with it"):
        mx.train(DOCS, runner=Processes(2), workers=2, **args)


@pytest.mark.parametrize("reduction", ["mean", "token_mean"])
def test_processes_train_like_one_process(reduction: str) -> None:
    one = _run_train(None, reduction)
    two = _run_train(2, reduction)
    assert len(two.losses) == len(one.losses) == 4
    np.testing.assert_allclose(two.losses, one.losses, rtol=1e-12)
    for name in FIELDS:
        xp_assert_close(getattr(two.params, name), getattr(one.params, name), rtol=1e-12)
    again = _run_train(2, reduction)
    assert again.losses == two.losses  # the same shards combine in the same order
    want = mx.sample(one.params, TOKENIZER, 30, seed=5)
    assert mx.sample(one.params, TOKENIZER, 30, workers=3, seed=5) == want


def test_shards_run_in_workers_that_fail_clearly() -> None:
    params = mx.init_params(CONFIG)
    with WorkerPool(3) as pool:
        parts = pool.map(_pid, params, [np.arange(9)])
        pids = pool.pids()
    assert [bounds for bounds, _ in parts] == [(0, 3), (3, 6), (6, 9)]
    ran = [p for _, shard in parts for p in shard]
    assert set(ran[:3]) == {os.getpid()} and len(set(ran[3:])) >= 1 and os.getpid() not in ran[3:]
    assert set(ran[3:]) <= set(pids)
    for pid in pids:  # close() waited for them
        assert not _alive(pid)
    # an error in a worker is raised here
    with WorkerPool(2) as pool, pytest.raises(ValueError, match="negative row in a shard of 2"):
        pool.map(_fail_on_negative, params, [np.array([0, 1, 2, -1])])
    # shard bounds cover the rows
    assert shard_bounds(7, 3) == [(0, 2), (2, 4), (4, 7)]
    assert shard_bounds(2, 4) == [(0, 1), (1, 2)]  # no empty shards
    # a killed worker is one runtime error then replaced
    with WorkerPool(2) as pool:
        pool.map(_pid, params, [np.arange(4)])
        (victim,) = pool.pids()
        os.kill(victim, signal.SIGKILL)
        _wait_gone(victim)
        with pytest.raises(RuntimeError, match="worker process died"):
            pool.map(_pid, params, [np.arange(4)])
        parts = pool.map(_pid, params, [np.arange(4)])  # a fresh worker
        assert parts[1][1][0] != victim
    # a worker killed mid step is one runtime error
    with WorkerPool(2) as pool:
        pool.map(_pid, params, [np.arange(2)])
        (victim,) = pool.pids()
        killer = subprocess.Popen(
            [sys.executable, "-c", f"import os,time; time.sleep(0.5); os.kill({victim}, 9)"]
        )
        with pytest.raises(RuntimeError, match="died during the step"):
            pool.map(_sleep, params, [np.arange(2)], 5.0)
        killer.wait()


_DAEMONIC = """
import multiprocessing as mp
import microgpt_xp as mx

def job(q):
    try:
        mx.train(mx.default_docs()[:100], steps=1, workers=2)
        q.put("no error")
    except Exception as exc:
        q.put(f"{type(exc).__name__}: {exc}")

if __name__ == "__main__":
    q = mp.get_context("spawn").Queue()
    p = mp.get_context("spawn").Process(target=job, args=(q,), daemon=True)
    p.start()
    print(q.get(timeout=120))
    p.join()
"""


def test_a_daemonic_process_or_no_main_guard_is_a_clear_error(tmp_path: Path) -> None:
    script = tmp_path / "daemonic.py"  # spawn imports the job from its file
    script.write_text(_DAEMONIC)
    out = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=180)
    assert out.stdout.startswith("RuntimeError:"), out.stdout + out.stderr
    assert "daemonic" in out.stdout
    script = tmp_path / "unguarded.py"
    script.write_text(
        "import microgpt_xp as mx\nmx.train(mx.default_docs()[:50], steps=1, workers=2)\n"
    )
    out = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert out.stderr.count("Traceback") == 1, out.stderr  # the parent's, no child's
    assert 'if __name__ == "__main__":' in out.stderr.splitlines()[-1]


_PARENT = """
import os, sys, time
import microgpt_xp as mx

how = sys.argv[1]
docs = mx.default_docs()

def progress(step, loss):
    if step == 2:
        print("training", flush=True)
    if step == 3 and how == "exit":
        os._exit(0)
    time.sleep(0.05)

mx.train(docs, steps=100000, batch_size=64, workers=3, callback=progress)
"""


def _descendants(pid: int) -> set[int]:
    """Every process whose chain of parents reaches ``pid`` (from /proc)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped, does not count)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait_gone(pid: int, seconds: float = 3.0) -> bool:
    deadline = time.monotonic() + seconds
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM", "exit"])
def test_workers_die_with_their_parent(how: str) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT, how], stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout is not None and parent.stdout.readline().strip() == "training"
        children = _descendants(parent.pid)
        assert len(children) >= 2, children  # the workers (and multiprocessing's helper)
        if how != "exit":
            parent.send_signal(getattr(signal, how))
        parent.wait(timeout=30)
        time.sleep(3.0)
        left = [pid for pid in children if _alive(pid)]
        assert not left, f"processes of the dead parent still run: {left}"
    finally:
        if parent.poll() is None:
            parent.kill()


def test_this_process_blas_takes_one_core_while_workers_run() -> None:
    from threadpoolctl import threadpool_info

    def blas() -> list[int]:
        return [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]

    before = blas()
    during: list[list[int]] = []
    args = dict(steps=2, batch_size=24, config=CONFIG, workers=2)
    mx.train(DOCS, **args, callback=lambda s, _: during.append(blas()))
    assert during == [[1] * len(before)] * 2
    assert blas() == before  # given back when the call ends
    # train(workers=2, threads=1) closes its pool inside the thread limit
    counts = sorted({i["num_threads"] for i in threadpool_info()})
    mx.train(DOCS, steps=1, batch_size=4, workers=2, threads=1, config=CONFIG)
    assert sorted({i["num_threads"] for i in threadpool_info()}) == counts


_KILLS = """
import multiprocessing, os, random, signal, sys, threading, time
import microgpt_xp as mx
from microgpt_xp._files import claim
from microgpt_xp.runners import WorkerDied

docs, cp, rng, killed = mx.default_docs()[:200], sys.argv[1], random.Random(0), []
vocab = mx.Tokenizer.from_docs(docs).vocab_size
config = mx.GPTConfig(vocab, n_embd=8, n_head=2, n_layer=1, block_size=8)

def kill_a_worker(delay):
    while not multiprocessing.active_children():
        time.sleep(0.005)
    time.sleep(delay)  # any moment of a step: sending, computing, replying
    killed.append(time.monotonic())
    os.kill(multiprocessing.active_children()[0].pid, signal.SIGKILL)

if __name__ == "__main__":
    for run in range(int(sys.argv[2])):
        killer = threading.Thread(target=kill_a_worker, args=(rng.uniform(0, 2.0),), daemon=True)
        killer.start()
        try:
            mx.train(docs, steps=10**6, batch_size=4, workers=2, checkpoint=cp,
                     checkpoint_every=7, overwrite=True, config=config)
        except WorkerDied as exc:
            assert "died during the step" in str(exc), exc
        killer.join()
        assert time.monotonic() - killed[-1] < 5.0, "ended late"
        with claim(cp, exist_ok=True):  # released
            pass
        if os.path.exists(cp):
            mx.load(cp)  # intact
    print("ok", len(killed))
"""


def test_a_worker_killed_at_any_moment_ends_the_run(tmp_path: Path) -> None:
    """A run ends with WorkerDied, whatever moment of a step its worker dies."""
    script = tmp_path / "kills.py"
    script.write_text(_KILLS)
    cmd = [sys.executable, script, str(tmp_path / "k.npz"), "16"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    assert out.stdout.strip() == "ok 16", out.stdout + out.stderr
