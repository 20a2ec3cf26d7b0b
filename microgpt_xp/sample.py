"""Batched generation through the KV cache, with temperature."""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterator
from typing import Any

import numpy as np

from . import _xp
from . import primitives as P
from ._xp import array_namespace
from .dask_steps import (
    Weights,
    check_chunk_backend,
    check_chunk_size,
    chunk_bounds,
    dask_modules,
    host_params,
    imports_settled,
    on_backend,
    spec_array,
    weights_node,
)
from .data import Tokenizer
from .model import KVCache, decode_hidden
from .parallel import WorkerPool, check_workers
from .params import Params


def choose(probs: Any, u: Any) -> Any:
    """Inverse-CDF draw of one id per row, as the standard library's ``choices`` does.

    ``probs (B, V)`` (not necessarily normalised), ``u (B,)`` uniforms in ``[0, 1)`` of the
    same namespace and device. With ``c`` the running sums of a row, returns the number of
    ``c[0..V-2]`` that are ``<= u * c[V-1]``: ``(B,)`` int64 ids.
    """
    xp = array_namespace(probs, u)
    return choose_columns(xp.matrix_transpose(probs), u)


def choose_columns(probs_t: Any, u: Any) -> Any:
    """:func:`choose` for probabilities laid out ``(V, B)``, one column per draw (the
    running sums and the counts run over the leading axis, a vectorized pass per id)."""
    c = P.cumulative_sum0(probs_t)
    hits = c[:-1, :] <= (u * c[-1, :])[None, :]
    xp = array_namespace(hits)
    return xp.sum(xp.astype(hits, xp.int64), axis=0)


#: The largest logit magnitude for which ``logits / temperature`` is sure not to overflow
#: when the temperature is at least ``LOGIT_BOUND / finfo(dtype).max``; below that,
#: sampling draws the argmax (see :func:`decode_batch`).
LOGIT_BOUND = 1e4

#: Samples generated at once when no batch size is given (by :func:`iter_samples`,
#: :func:`sample_tokens` and :func:`sample`): big enough that a position's Python
#: overhead is paid over many rows, small enough that a batch stays in the CPU's caches
#: and a few MB, whatever the number of samples. The fastest size on NumPy in the
#: measurements of docs/cli.md ("The default batch size").
DEFAULT_BATCH_SIZE = 2_000


def check_temperature(temperature: Any) -> float:
    """``temperature`` as a float if it is a finite real number ``> 0`` (any real type:
    ``int``, ``float``, ``numpy.float32``, ...; not ``bool``), else ``ValueError``."""
    if isinstance(temperature, numbers.Real) and not isinstance(temperature, bool):
        value = float(temperature)
        if math.isfinite(value) and value > 0:
            return value
    raise ValueError(f"temperature must be a positive number, got {temperature!r}")


def sample_tokens(
    params: Params,
    bos: int,
    num_samples: int,
    *,
    temperature: float = 0.5,
    seed: int = 0,
    batch_size: int | None = None,
    chunks: int | None = None,
    workers: int | None = None,
    jit: bool | None = None,
) -> np.ndarray:
    """Generate ``num_samples`` sequences from BOS; returns ``(N, block_size)`` int64 ids
    on the host, each row cut at its first BOS (which stays, followed by more BOS).

    Sample ``i`` is driven by row ``i`` of ``numpy.random.default_rng(seed).random((N,
    block_size))``, drawn on the host batch by batch (:func:`row_uniforms`) and moved to
    the params' device, so the result for a seed does not depend on ``batch_size``
    (samples generated at once; ``None``: :data:`DEFAULT_BATCH_SIZE`, on Dask all), on
    Dask ``chunks`` (rows per task; Dask params run one task per chunk, :func:`generate`),
    nor on ``workers`` (processes that share a NumPy batch, see
    :mod:`microgpt_xp.parallel`; ``None``: this one alone), nor on ``jit`` (see
    :func:`decode_batch`). The batches one at a time: :func:`iter_sample_tokens`.
    """
    batches = iter_sample_tokens(
        params,
        bos,
        num_samples,
        temperature=temperature,
        seed=seed,
        batch_size=batch_size,
        chunks=chunks,
        workers=workers,
        jit=jit,
    )
    return np.concatenate(list(batches), axis=0)


def iter_sample_tokens(
    params: Params,
    bos: int,
    num_samples: int,
    *,
    temperature: float = 0.5,
    seed: int = 0,
    batch_size: int | None = None,
    chunks: int | None = None,
    workers: int | None = None,
    jit: bool | None = None,
) -> Iterator[np.ndarray]:
    """:func:`sample_tokens` one batch at a time: yields ``(b, block_size)`` int64 host
    arrays, ``batch_size`` rows each (the last may be shorter), whose concatenation is
    ``sample_tokens(...)`` with the same arguments. Memory follows the batch, not
    ``num_samples``. The arguments are checked now, the work is done as the batches are
    taken (worker processes, if any, end when the iterator is exhausted or closed)."""
    _xp.check_positive_int(num_samples, "the number of samples")
    temperature = check_temperature(temperature)
    if batch_size is not None:
        _xp.check_positive_int(batch_size, "batch size")
    check_workers(workers, params.backend)
    cfg = params.config
    if not 0 <= bos < cfg.vocab_size:
        raise ValueError(f"bos id {bos} is outside [0, {cfg.vocab_size})")
    if params.backend == "dask":
        return _dask_batches(params, bos, num_samples, temperature, seed, batch_size, chunks)
    batch_size = DEFAULT_BATCH_SIZE if batch_size is None else batch_size
    return _eager_batches(
        params, bos, num_samples, 1.0 / temperature, seed, batch_size, workers, jit
    )


def _eager_batches(
    params: Params,
    bos: int,
    num_samples: int,
    inv_t: float,
    seed: int,
    batch_size: int,
    workers: int | None,
    jit: bool | None,
) -> Iterator[np.ndarray]:
    """The batches of :func:`iter_sample_tokens` on an eager namespace."""
    width = params.config.block_size
    # a range, not a list of bounds: any number of samples takes O(batch) memory
    bounds = ((a, min(a + batch_size, num_samples)) for a in range(0, num_samples, batch_size))
    if workers in (None, 1):
        for a, b in bounds:
            yield decode_batch(params, bos, row_uniforms(seed, a, b, width), inv_t, jit=jit)
        return
    with WorkerPool(workers) as pool:
        for a, b in bounds:
            uniforms = row_uniforms(seed, a, b, width)
            yield np.concatenate(
                [part for _, part in pool.map(_decode_rows, params, [uniforms], bos, inv_t)]
            )


def _dask_batches(
    params: Params,
    bos: int,
    num_samples: int,
    temperature: float,
    seed: int,
    batch_size: int | None,
    chunks: int | None,
) -> Iterator[np.ndarray]:
    """The batches of :func:`iter_sample_tokens` for Dask params: one computation per
    batch, one task per chunk of ``chunks`` rows (default: the batch)."""
    from .cluster import computing

    batch = num_samples if batch_size is None else batch_size
    chunk = min(batch, num_samples) if chunks is None else chunks
    batch = -(-batch // chunk) * chunk  # whole chunks per batch: none is computed twice
    ids = generate(
        params,
        num_samples,
        bos=bos,
        chunk_size=chunk,
        temperature=temperature,
        seed=seed,
        chunk_backend=_xp.backend_of(params.wte._meta),
    )
    for a, b in chunk_bounds(num_samples, batch):
        with computing():
            block = np.asarray(ids[a:b].compute())
        yield block


def _decode_rows(params: Params, uniforms: np.ndarray, bos: int, inv_temperature: float) -> Any:
    """:func:`decode_batch` with the rows first (the shape :meth:`WorkerPool.map` calls)."""
    return decode_batch(params, bos, uniforms, inv_temperature)


def decode_batch(
    params: Params,
    bos: int,
    uniforms: np.ndarray,
    inv_temperature: float,
    *,
    chunks: int | None = None,
    early_stop: bool = True,
    jit: bool | None = None,
) -> np.ndarray:
    """Generate one batch from BOS through the KV cache with host ``uniforms (b,
    block_size)`` (one per sample and position; row ``i`` drives sample ``i``); returns
    ``(b, block_size)`` int64 ids on the host, each row BOS from its first BOS on.

    The uniforms are moved to the params' device (on Dask, ``chunks`` rows per chunk);
    on eager backends the loop stops once every row has sampled BOS (unless
    ``early_stop=False``, which always runs ``block_size`` positions, as a benchmark does).
    Each position is one call of a function of fixed shapes (the KV cache is
    preallocated), compiled once per batch size where the namespace has a compiler and
    ``jit`` allows (see :func:`microgpt_xp.score`).

    A temperature so small that logits divided by it could overflow the params' dtype
    (``inv_temperature`` above its largest value over :data:`LOGIT_BOUND`: below about
    3e-35 in float32, 6e-305 in float64) draws the argmax at every position instead, the
    limit of sampling as the temperature goes to 0 (ties, if any, are drawn among).
    """
    xp, backend, dev = params.xp, params.backend, params.device
    compile_fn = _xp.compiler(backend, jit)
    t = params.config.block_size
    b = uniforms.shape[0]
    dtype = str(params.dtype).split(".")[-1]
    u = _xp.asarray(
        uniforms, backend, device=dev, dtype=dtype, chunks=None if chunks is None else (chunks, -1)
    )
    token = _xp.asarray(
        np.full(b, bos, dtype=np.int64),
        backend,
        device=dev,
        chunks=None if chunks is None else (chunks,),
    )
    bos_id = P.full((), bos, token)
    greedy = not inv_temperature * LOGIT_BOUND <= float(np.finfo(dtype).max)
    inv_t = P.full((), 1.0 if greedy else inv_temperature, params.wte)
    done = token != token
    cache = KVCache.zeros(params, b)
    position = _greedy_position if greedy else _sample_position
    step = position if compile_fn is None else _xp.compiled(position, backend)
    rows = []
    for pos in range(t):
        token, cache, done, row = step(params, cache, token, u[:, pos], done, bos_id, inv_t)
        rows.append(row)
        if early_stop and not _xp.is_lazy(done) and bool(xp.all(done)):
            break
    ids = _xp.to_numpy(xp.stack(rows, axis=1))
    full = np.full((b, t), bos, dtype=np.int64)
    full[:, : ids.shape[1]] = ids
    return full


def _sample_position(
    params: Params, cache: KVCache, token: Any, u: Any, done: Any, bos: Any, inv_t: Any
) -> tuple[Any, KVCache, Any, Any]:
    """One position of :func:`decode_batch`: ``token (B,)`` in, the next ``token``, the
    cache, ``done (B,)`` (rows that have drawn BOS) and the ``row (B,)`` to record (BOS from
    a row's first BOS on). ``u (B,)`` uniforms, ``bos`` and ``inv_t`` 0-d arrays."""
    xp = params.xp
    # the ids are the model's own draws (checked once, at the start, by bos)
    x_t, cache = decode_hidden(params, token, cache)
    # logits / temperature = (lm_head / temperature) @ x_t, laid out (V, B), so that the
    # softmax and the draw reduce over the leading axis; the draw is scale-free, so it
    # takes softmax's exponentials unnormalised
    z = (params.lm_head * inv_t) @ x_t
    token = choose_columns(xp.exp(z - xp.max(z, axis=0, keepdims=True)), u)
    return _advance(xp, token, cache, done, bos)


def _greedy_position(
    params: Params, cache: KVCache, token: Any, u: Any, done: Any, bos: Any, inv_t: Any
) -> tuple[Any, KVCache, Any, Any]:
    """:func:`_sample_position` in the limit of a temperature going to 0: the largest
    logit is drawn (``u`` draws among ties); ``inv_t`` is not used."""
    xp = params.xp
    x_t, cache = decode_hidden(params, token, cache)
    z = params.lm_head @ x_t
    top = xp.astype(z == xp.max(z, axis=0, keepdims=True), z.dtype)
    return _advance(xp, choose_columns(top, u), cache, done, bos)


def _advance(
    xp: Any, token: Any, cache: KVCache, done: Any, bos: Any
) -> tuple[Any, KVCache, Any, Any]:
    """The end of a position: mark rows that drew BOS as done, record BOS from then on."""
    done = done | (token == bos)
    return token, cache, done, xp.where(done, bos, token)


# -- on Dask: one task per chunk of samples ---------------------------------------------
def row_uniforms(seed: int, start: int, stop: int, width: int) -> np.ndarray:
    """Rows ``start .. stop - 1`` of ``numpy.random.default_rng(seed).random((N, width))``
    for any ``N >= stop``, without drawing the rows before them (the PCG64 stream is
    advanced by ``start * width`` draws). These are the uniforms
    :func:`microgpt_xp.sample.sample_tokens` uses, so a chunk needs O(chunk) memory."""
    bits = np.random.PCG64(seed)  # what default_rng(seed) wraps
    bits.advance(start * width)
    return np.random.Generator(bits).random((stop - start, width))


def _generate_block(
    spec: Any,
    host: Params,
    bos: int,
    inv_t: float,
    seed: int,
    backend: str,
    device: Any,
) -> np.ndarray:
    """One chunk's samples ``(size, block_size)`` int64, as ``sample_tokens`` makes them."""
    imports_settled()
    start, stop, _ = spec[0]
    params = on_backend(host, backend, device)
    uniforms = row_uniforms(seed, start, stop, host.config.block_size)
    return decode_batch(params, bos, uniforms, inv_t)


def generate(
    params: Params,
    num_samples: int,
    *,
    bos: int,
    chunk_size: int = 8192,
    temperature: float = 0.5,
    seed: int = 0,
    weights: Weights = "graph",
    client: Any = None,
    chunk_backend: str = "numpy",
    chunk_device: Any = None,
) -> Any:
    """``num_samples`` sequences from BOS through the KV cache, as one lazy Dask array
    ``(N, block_size)`` int64 chunked ``chunk_size`` rows a chunk; rows are cut at their
    first BOS (which stays, followed by more BOS) as in
    :func:`microgpt_xp.sample.sample_tokens`.

    Row ``i`` uses row ``i`` of ``default_rng(seed).random((N, block_size))``, drawn
    inside its chunk's task (:func:`row_uniforms`), so the samples of a seed are those of
    ``sample_tokens(params, bos, N, seed=seed)`` whatever the chunking, and no O(N) array
    of draws is built. ``weights``, ``client``, ``chunk_backend`` and ``chunk_device`` are
    as in :func:`microgpt_xp.scale.score_corpus`: with ``weights="graph"`` (the default)
    the array can be computed after the client that built it has closed; with
    ``"scatter"`` the weights live on that client's cluster, so compute it first.
    """
    dask, da = dask_modules()
    host = host_params(params)
    cfg = host.config
    _xp.check_positive_int(num_samples, "the number of samples")
    temperature = check_temperature(temperature)
    if not 0 <= bos < cfg.vocab_size:
        raise ValueError(f"bos id {bos} is outside [0, {cfg.vocab_size})")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    check_chunk_size(chunk_size)
    check_chunk_backend(chunk_backend)
    bounds = chunk_bounds(num_samples, chunk_size)
    name = f"microgpt-rows-{dask.base.tokenize(num_samples, chunk_size)}"
    specs = spec_array([(s, e, None) for s, e in bounds], name)
    return da.blockwise(
        _generate_block,
        "ij",
        specs,
        "i",
        weights_node(host, weights, client),
        None,
        bos,
        None,
        1.0 / temperature,
        None,
        seed,
        None,
        chunk_backend,
        None,
        chunk_device,
        None,
        new_axes={"j": cfg.block_size},
        adjust_chunks={"i": tuple(e - s for s, e in bounds)},
        dtype=np.int64,
        meta=np.empty((0, 0), dtype=np.int64),
    )


def sample(
    params: Params,
    tokenizer: Tokenizer,
    num_samples: int = 20,
    *,
    temperature: float = 0.5,
    seed: int = 0,
    batch_size: int | None = None,
    chunks: int | None = None,
    workers: int | None = None,
    jit: bool | None = None,
) -> list[str]:
    """Generate ``num_samples`` documents (names) with the KV cache at ``temperature``.

    Each starts from BOS at position 0 and stops at the first sampled BOS or after
    ``block_size`` tokens. Draws are made on the host (see :func:`sample_tokens`), so a
    seed gives the same names whatever the batch size (samples generated at once;
    ``None``: :data:`DEFAULT_BATCH_SIZE`), chunking or ``workers`` (processes sharing a
    NumPy batch; ``None``: this one alone). Runs on the params' namespace and device:
    compiled where it has a compiler (``jit``, see :func:`decode_batch`), as one task per
    chunk of ``chunks`` samples on Dask. The names batch by batch: :func:`iter_samples`.
    """
    batches = iter_samples(
        params,
        tokenizer,
        num_samples,
        temperature=temperature,
        seed=seed,
        batch_size=batch_size,
        chunks=chunks,
        workers=workers,
        jit=jit,
    )
    return [name for names in batches for name in names]


def iter_samples(
    params: Params,
    tokenizer: Tokenizer,
    num_samples: int,
    *,
    batch_size: int | None = None,
    temperature: float = 0.5,
    seed: int = 0,
    chunks: int | None = None,
    workers: int | None = None,
    jit: bool | None = None,
) -> Iterator[list[str]]:
    """The names of :func:`sample`, a list per batch of ``batch_size`` samples (``None``:
    :data:`DEFAULT_BATCH_SIZE`; on Dask, all), made as they are taken: memory follows
    the batch, not ``num_samples``, so any number of names can be streamed.

    The concatenated lists are ``sample(params, tokenizer, num_samples, ...)`` with the
    same seed and temperature, whatever the batch size. The arguments are checked at the
    call, before the first batch.

    >>> import microgpt_xp as mx
    >>> from microgpt_xp.sample import iter_samples
    >>> tokenizer = mx.Tokenizer("ab")
    >>> params = mx.init_params(mx.GPTConfig(tokenizer.vocab_size, block_size=4), seed=0)
    >>> batches = list(iter_samples(params, tokenizer, 5, batch_size=2, seed=1))
    >>> tuple(len(names) for names in batches)
    (2, 2, 1)
    >>> sum(batches, []) == mx.sample(params, tokenizer, 5, seed=1)
    True
    """
    if tokenizer.vocab_size != params.config.vocab_size:
        raise ValueError(
            f"tokenizer has {tokenizer.vocab_size} ids but the model {params.config.vocab_size}"
        )
    batches = iter_sample_tokens(
        params,
        tokenizer.bos,
        num_samples,
        temperature=temperature,
        seed=seed,
        batch_size=batch_size,
        chunks=chunks,
        workers=workers,
        jit=jit,
    )
    return (tokenizer.decode_rows(ids) for ids in batches)
