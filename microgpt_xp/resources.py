"""What a run takes of the machine: BLAS threads chosen from the model's size and the
machine's load, and the number of documents scored at once that fits a memory budget.

**Threads** (:func:`blas_threads`, applied by :func:`use_threads`). OpenBLAS (NumPy's
BLAS) and PyTorch's CPU pool use every core by default. A second thread only pays when
each product is big enough, and it costs dearly when another process keeps a core busy:
the threads of a product wait for each other, and the one sharing its core with the
other process gets the CPU in slices of milliseconds. The policy: ``work //
WORK_PER_THREAD`` threads, ``work = tokens * n_embd**2`` (a layer's products, up to a
factor 12), at least 1, at most the usable cores *that other processes leave free*,
sampled from ``/proc/stat`` over :data:`LOAD_WINDOW` seconds only when more than one
thread is wanted. Decoding counts one token a row, scoring as training. Measured on 2
cores (Intel Xeon, OpenBLAS 0.3.31, NumPy 2.4, float32): ``python -m benchmarks.e2e
threads --rounds 5 --max-rounds 12``, whole ``train`` calls, ms a step (median of the
rounds in which other processes used at most 15 % of the CPUs; kept/run), BLAS threads
by the policy (its count), as today (every core) and one; then beside one CPU-bound
process (``busy``), where the policy took 1 thread::

    model            B   work   policy  (n)  today  1 thread | busy: policy  today  kept
    L1 C16 T16      32   0.12M    1.20  (1)   1.30     1.26  |         1.21   1.37   5/5
    L1 C16 T16      64   0.25M    1.89  (1)   1.97     1.90  |         1.92   3.28   5/5
    L1 C16 T16    1024   4.0M    34.3   (2)  34.2     34.6   |        35.3   72.3    5/5
    L2 C64 T36       8   1.1M     3.12  (2)   3.14     3.48  |         3.52   7.38   2/12
    L2 C64 T36      32   4.5M    12.7   (2)  12.9     14.3   |        14.2   25.6    5/5
    L2 C64 T36      64   9.0M    25.4   (2)  24.6     29.7   |        30.9   78.3    5/5
    L4 C128 T64     32   32M    102     (2) 102      137     |       142    273      5/5

(``M`` = 2**20.) Quiet, the policy is the faster count or today's (where it is today's,
the per-round ratios span 1.0: noise); beside a busy process it keeps 0.99x (the spec's
model) and 0.82-0.90x (2 layers, 64 channels) of its quiet speed, where today's threads
fall to 0.33-0.89x of it. The second thread paid between 0.25M and 1.1M of work; counts above
2 extrapolate the rule (this machine has 2 cores). PyTorch's pool behaves alike
(``--backend torch``: at L2 C64 T36 B=32 its 2 threads are 1.42x faster than 1 when
quiet, and 2.7x slower than that beside a busy process, up to 13x in some rounds), so
:func:`use_threads` sets ``torch.set_num_threads`` to the same count where torch is
imported; JAX's XLA pool cannot be resized once it runs.

**Memory** (:func:`activation_bytes`, :func:`chunk_for_budget`, :func:`score_chunk`).
Scoring keeps the activations of every layer of a chunk alive until its losses are
taken. Their peak per document of ``T = block_size`` tokens (shorter documents take
less), in elements of the params' dtype, is ``T*C*(2 + 16*L) + (L+1)*H*T**2 + max(5*T*C,
4*V*T)`` plus ``32*(T + 1)`` bytes of ids and masks (``C`` channels, ``L`` layers, ``H``
heads, ``V`` vocabulary). tracemalloc's peak of one
:func:`~microgpt_xp.scale.score_docs` chunk was 0.95-1.05x the formula (the spec's model
at 64 and 1,024 documents, L2 C64 T36 at 64 and 1,024 and in float64, the medium model
at 6 and 188; tests/test_resources.py holds it within 10 %). Scoring is also fastest
when a chunk's activations stay small (``python -m benchmarks.bench --workload score
--batch-size 6,39,64,256,492,1024 --threads 1``: the best tokens/s at 492, 39 and 6
documents for the three models, whose activations are 15-17 MB), so the default chunk is
the one whose activations fit :data:`FAST_SCORE_BYTES`, never above the budget. ``eval``
of a 2-layer 64-channel model over 32,083 names: 499 MB peak RSS and 6.7 s in chunks of
1,024; 63 MB and 1.8 s in :func:`score_chunk`'s 39.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

from ._xp import check_dtype, check_positive_int
from .config import GPTConfig

#: The workloads :func:`blas_threads` knows: a training step, scoring, a decoding position.
WORKLOADS = ("train", "score", "decode")
#: ``tokens * n_embd**2`` of a step per BLAS thread: a second thread from 2**20 (measured).
WORK_PER_THREAD = 1 << 19
#: Seconds over which :func:`busy_cpus` watches the other processes.
LOAD_WINDOW = 0.1
#: The default memory budget of a chunk's activations, in bytes (~500 MB).
DEFAULT_BUDGET = 500_000_000
#: Activation bytes of a scoring chunk at its fastest (measured: the best held 15-17 MB).
FAST_SCORE_BYTES = 16 << 20


# -- the machine's load ----------------------------------------------------------------------
class CpuSample(NamedTuple):
    """Cumulative jiffies: machine ``busy`` and ``total``, and ``own`` (this process, its
    reaped children and the given other processes)."""

    busy: int
    total: int
    own: int


def _jiffies(pid: int | str, children: bool = False) -> int:
    """User + system jiffies of process ``pid`` (all threads; plus reaped children)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            v = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return sum(int(x) for x in v[11 : 15 if children else 13])  # utime stime [cutime cstime]


def cpu_sample(pids: Iterable[int] = ()) -> CpuSample | None:
    """Read ``/proc/stat`` and our processes' counters (``pids`` count as ours); ``None``
    without ``/proc``."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    busy = v[0] + v[1] + v[2] + v[5] + v[6] + (v[7] if len(v) > 7 else 0)  # steal counts
    own = _jiffies("self", children=True) + sum(_jiffies(p) for p in pids)
    return CpuSample(busy, busy + v[3] + v[4], own)


def other_cpu_share(before: CpuSample | None, after: CpuSample | None) -> float | None:
    """Share (0..1) of the machine's CPU capacity that other processes used between two
    samples (busy jiffies minus our own, over all CPUs' jiffies); ``None`` without data."""
    if before is None or after is None:
        return None
    total = max(after.total - before.total, 1)
    return max(0.0, ((after.busy - before.busy) - (after.own - before.own)) / total)


def usable_cpus() -> int:
    """The cores this process may run on (its affinity mask, else ``os.cpu_count()``)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def busy_cpus(window: float = LOAD_WINDOW) -> float:
    """How many CPUs other processes kept busy over the next ``window`` seconds (this
    process sleeps meanwhile); 0.0 where ``/proc/stat`` cannot be read."""
    before = cpu_sample()
    time.sleep(window)
    share = other_cpu_share(before, cpu_sample())
    return 0.0 if share is None else share * (os.cpu_count() or 1)


# -- threads ---------------------------------------------------------------------------------
def blas_threads(
    config: GPTConfig,
    batch_size: int,
    *,
    workload: str = "train",
    cpus: int | None = None,
    busy: float | None = None,
) -> int:
    """The BLAS threads for ``batch_size`` rows of ``workload`` (``"train"`` or
    ``"score"``: documents of ``block_size`` tokens; ``"decode"``: one token a row) on
    a model of ``config``: ``tokens * n_embd**2 // WORK_PER_THREAD``, at least 1, at most
    the ``cpus`` (default :func:`usable_cpus`) less those other processes keep busy
    (``busy``, default :func:`busy_cpus`, sampled only when more than one thread is
    wanted), rounded to the nearest CPU. The measurements behind it: the module's
    docstring."""
    if workload not in WORKLOADS:
        raise ValueError(f"workload must be one of {', '.join(WORKLOADS)}, got {workload!r}")
    check_positive_int(batch_size, "batch size")
    cpus = usable_cpus() if cpus is None else check_positive_int(cpus, "cpus")
    tokens = batch_size * (1 if workload == "decode" else config.block_size)
    wanted = min(cpus, max(1, tokens * config.n_embd**2 // WORK_PER_THREAD))
    if wanted == 1:
        return 1
    busy = busy_cpus() if busy is None else busy
    return max(1, min(wanted, cpus - int(busy + 0.5)))


def check_threads(threads: Any) -> int | None:
    """``threads`` if it is ``None`` (the policy's choice) or a positive int, else
    ``ValueError``."""
    return None if threads is None else check_positive_int(threads, "threads")


@contextlib.contextmanager
def use_threads(
    threads: int | None = None,
    *,
    config: GPTConfig | None = None,
    batch_size: int | None = None,
    workload: str = "train",
) -> Iterator[int]:
    """Run the ``with`` block on ``threads`` BLAS threads (threadpoolctl) and as many
    PyTorch threads if torch is imported; both are restored on exit. ``None``: the choice
    of :func:`blas_threads` for ``config``, ``batch_size`` and ``workload`` (which are
    then required). Yields the count::

        with use_threads(None, config=params.config, batch_size=32) as n:
            ...  # train on n threads
    """
    from threadpoolctl import threadpool_limits

    count = check_threads(threads)
    if count is None:
        if config is None or batch_size is None:
            raise ValueError("use_threads(None) needs the config and batch_size to choose")
        count = blas_threads(config, batch_size, workload=workload)
    torch = sys.modules.get("torch")  # set only where already in use: never imported here
    before = torch.get_num_threads() if torch is not None else None
    with threadpool_limits(limits=count, user_api="blas"):
        if torch is not None:
            torch.set_num_threads(count)
        try:
            yield count
        finally:
            if torch is not None:
                torch.set_num_threads(before)


# -- memory ----------------------------------------------------------------------------------
def activation_bytes(config: GPTConfig, docs: int, *, dtype: str = "float32") -> int:
    """Peak bytes of the activations that scoring ``docs`` documents at once keeps
    (:func:`microgpt_xp.score` on NumPy, documents of ``block_size`` tokens): the formula
    and its check are in the module's docstring."""
    check_positive_int(docs, "documents")
    t, c, layers = config.block_size, config.n_embd, config.n_layer
    # the caches of every layer; the attention's probabilities, and its causal mask, kept
    # once for all layers (a cached constant of up to primitives._numpy.MASK_CACHE_BYTES)
    elements = t * c * (2 + 16 * layers) + (layers + 1) * config.n_head * t * t
    elements += max(5 * t * c, 4 * config.vocab_size * t)
    itemsize = {"float32": 4, "float64": 8}[check_dtype(dtype)]
    return docs * (elements * itemsize + 32 * (t + 1))


def chunk_for_budget(
    config: GPTConfig, *, budget_bytes: int = DEFAULT_BUDGET, dtype: str = "float32"
) -> int:
    """The most documents scored at once whose activations (:func:`activation_bytes`)
    stay within ``budget_bytes``; at least 1 (one document may exceed a tiny budget)."""
    check_positive_int(budget_bytes, "budget_bytes")
    return max(1, budget_bytes // activation_bytes(config, 1, dtype=dtype))


def score_chunk(
    config: GPTConfig, *, budget_bytes: int = DEFAULT_BUDGET, dtype: str = "float32"
) -> int:
    """The default chunk of scoring (``eval``): the fastest measured size, activations
    within :data:`FAST_SCORE_BYTES`, and never above ``budget_bytes``."""
    return chunk_for_budget(config, budget_bytes=min(budget_bytes, FAST_SCORE_BYTES), dtype=dtype)
