"""Batched generation through the KV cache, with temperature, top-k and a prompt.

One function makes the batches (:func:`iter_sample_tokens`); :func:`sample_tokens`,
:func:`iter_samples` and :func:`sample` are thin wrappers over it that take the same
options (:class:`SampleOptions`). How a batch is spread over workers is a runner's
business (:mod:`microgpt_xp.runners`); a batch's draws never depend on it.
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np

from . import _xp, runners
from . import layers as L
from . import primitives as P
from ._xp import array_namespace
from .data import Tokenizer
from .model import KVCache, decode_hidden, qkv_weight
from .params import Params, flatten

if TYPE_CHECKING:
    from typing_extensions import Unpack


#: The largest logit magnitude for which ``logits / temperature`` is sure not to overflow
#: when the temperature is at least ``LOGIT_BOUND / finfo(dtype).max``; below that,
#: sampling draws the argmax (see :func:`decode_batch`).
LOGIT_BOUND = 1e4

#: Samples generated at once when no batch size is given: big enough that a position's
#: Python overhead is paid over many rows, small enough that a batch's cache stays in the
#: CPU's caches (``python -m benchmarks.e2e sample``: 1,000 was the fastest of 250 to
#: 4,000 for a 2-layer 64-channel model; 500 and 2,000 were 1-5 % slower).
DEFAULT_BATCH_SIZE = 1_000


class SampleOptions(TypedDict, total=False):
    """The options every sampling function takes.

    Attributes:
        temperature: divides the logits (default 0.5); a finite number > 0.
        seed: sample ``i`` is driven by row ``i`` of ``default_rng(seed).random((N,
            block_size))`` (:func:`row_uniforms`), whatever the batching (default 0).
        top_k: draw among the ``k`` largest logits only (ties with the ``k``-th kept);
            ``None`` (default): among all.
        prompt: the start every sample continues (ids after BOS; the text for
            :func:`sample`/:func:`iter_samples`); samples are returned with it.
        batch_size: samples generated at once (default :data:`DEFAULT_BATCH_SIZE`).
        runner: how a batch is spread over workers (default: this process; Dask params:
            one task per chunk of ``chunks`` samples).
        chunks, workers, jit: one-word spellings of ``runner=DaskTasks(chunks)``,
            ``Processes(workers)`` and ``Local(jit)``.
    """

    temperature: float
    seed: int
    top_k: int | None
    prompt: Any
    batch_size: int | None
    runner: runners.Runner | None
    chunks: int | None
    workers: int | None
    jit: bool | None


def check_temperature(temperature: Any) -> float:
    """``temperature`` as a float if it is a finite real number ``> 0`` (any real type:
    ``int``, ``float``, ``numpy.float32``, ...; not ``bool``), else ``ValueError``."""
    if isinstance(temperature, numbers.Real) and not isinstance(temperature, bool):
        value = float(temperature)
        if math.isfinite(value) and value > 0:
            return value
    raise ValueError(f"temperature must be a positive number, got {temperature!r}")


def iter_sample_tokens(
    params: Params, bos: int, num_samples: int, **options: Unpack[SampleOptions]
) -> Iterator[np.ndarray]:
    """Generate ``num_samples`` sequences from BOS (then the prompt, if any), a batch at a
    time: yields ``(b, block_size)`` int64 host arrays, each row the prompt's ids, then
    the sampled ids up to and including the first sampled BOS, then more BOS. Memory
    follows the batch, not ``num_samples``.

    The arguments are checked now, the work is done as the batches are taken (worker
    processes, if any, end when the iterator is exhausted or closed). See
    :class:`SampleOptions` for the options; the result for a seed does not depend on
    the batch size, the runner or ``jit``.
    """
    unknown = set(options) - set(SampleOptions.__annotations__)
    if unknown:
        raise TypeError(f"unexpected sampling options {sorted(unknown)}")
    _xp.check_positive_int(num_samples, "the number of samples")
    cfg = params.config
    xp = params.xp
    if _xp.read_scalar(xp.all(xp.isfinite(flatten(params))), bool) is False:
        raise ValueError("params hold weights that are not finite (NaN or inf): nothing to sample")
    if not 0 <= bos < cfg.vocab_size:
        raise ValueError(f"bos id {bos} is outside [0, {cfg.vocab_size})")
    inv_t = 1.0 / check_temperature(options.get("temperature", 0.5))
    seed = options.get("seed", 0)
    _xp.check_nonnegative_int(seed, "seed")
    top_k = options.get("top_k")
    if top_k is not None:
        _xp.check_positive_int(top_k, "top_k")
    prompt = _check_prompt(options.get("prompt"), bos, cfg.vocab_size, cfg.block_size)
    batch_size = options.get("batch_size")
    batch_size = DEFAULT_BATCH_SIZE if batch_size is None else batch_size
    _xp.check_positive_int(batch_size, "batch size")
    chunks = options.get("chunks")
    if chunks is not None:
        _xp.check_positive_int(chunks, "chunks")
    runner, home = runners.resolve(
        options.get("runner"),
        params.backend,
        workers=options.get("workers"),
        chunk_size=chunks,
        jit=options.get("jit"),
        like=params.wte,
    )
    if home != params.backend:  # Dask params: the tasks run on their chunks' backend
        params = params.to(home)
    return _batches(params, runner, bos, num_samples, batch_size, seed, inv_t, prompt, top_k)


def _check_prompt(prompt: Any, bos: int, vocab_size: int, block_size: int) -> tuple[int, ...]:
    ids = tuple(int(i) for i in (prompt or ()))
    if any(not 0 <= i < vocab_size or i == bos for i in ids):
        raise ValueError(
            f"prompt ids must lie in [0, {vocab_size}) and not be BOS ({bos}), got {list(ids)}"
        )
    if len(ids) >= block_size:
        raise ValueError(
            f"a prompt of {len(ids)} tokens leaves no position to sample in a block of "
            f"{block_size} (BOS comes first)"
        )
    return ids


def _batches(
    params: Params,
    runner: runners.Runner,
    bos: int,
    num_samples: int,
    batch_size: int,
    seed: int,
    inv_t: float,
    prompt: tuple[int, ...],
    top_k: int | None,
) -> Iterator[np.ndarray]:
    width = params.config.block_size
    try:
        # a range, not a list of bounds: any number of samples takes O(batch) memory
        for a in range(0, num_samples, batch_size):
            uniforms = row_uniforms(seed, a, min(a + batch_size, num_samples), width)
            if runner.shards:
                parts = runner.map(_decode_rows, params, [uniforms], bos, inv_t, prompt, top_k)
                yield np.concatenate(parts)
            else:
                yield decode_batch(
                    params, bos, uniforms, inv_t, prompt=prompt, top_k=top_k, jit=runner.jit
                )
    finally:
        runner.close()


def sample_tokens(
    params: Params, bos: int, num_samples: int, **options: Unpack[SampleOptions]
) -> np.ndarray:
    """:func:`iter_sample_tokens`'s batches as one ``(N, block_size)`` int64 host array."""
    return np.concatenate(list(iter_sample_tokens(params, bos, num_samples, **options)), axis=0)


def iter_samples(
    params: Params, tokenizer: Tokenizer, num_samples: int, **options: Unpack[SampleOptions]
) -> Iterator[list[str]]:
    """The documents (names) of :func:`iter_sample_tokens` as text, a list per batch;
    ``prompt`` is text here, and every sample starts with it.

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
    if not isinstance(tokenizer, Tokenizer):
        raise TypeError(f"tokenizer must be a Tokenizer, got {type(tokenizer).__name__}")
    if tokenizer.vocab_size != params.config.vocab_size:
        raise ValueError(
            f"tokenizer has {tokenizer.vocab_size} ids but the model {params.config.vocab_size}"
        )
    prompt = options.get("prompt")
    if prompt is not None:
        if not isinstance(prompt, str):
            raise TypeError(f"prompt must be text, got {type(prompt).__name__}")
        options = {**options, "prompt": tokenizer.encode(prompt)}
    batches = iter_sample_tokens(params, tokenizer.bos, num_samples, **options)
    return (tokenizer.decode_rows(ids) for ids in batches)


def sample(
    params: Params, tokenizer: Tokenizer, num_samples: int = 20, **options: Unpack[SampleOptions]
) -> list[str]:
    """Generate ``num_samples`` documents (names) with the KV cache: each starts from BOS
    (and the ``prompt``) and stops at the first sampled BOS or after ``block_size``
    tokens. A seed gives the same names whatever the batch size, runner or ``jit``. The
    names batch by batch: :func:`iter_samples`."""
    return [
        name for names in iter_samples(params, tokenizer, num_samples, **options) for name in names
    ]


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


def _decode_rows(
    params: Params,
    uniforms: np.ndarray,
    bos: int,
    inv_temperature: float,
    prompt: Sequence[int],
    top_k: int | None,
) -> Any:
    """:func:`decode_batch` with the rows first (the shape a runner's ``map`` calls)."""
    return decode_batch(params, bos, uniforms, inv_temperature, prompt=prompt, top_k=top_k)


def decode_batch(
    params: Params,
    bos: int,
    uniforms: np.ndarray,
    inv_temperature: float,
    *,
    prompt: Sequence[int] = (),
    top_k: int | None = None,
    early_stop: bool = True,
    jit: bool | None = None,
) -> np.ndarray:
    """Generate one batch from BOS (then ``prompt``) through the KV cache with host
    ``uniforms (b, block_size)`` (one per sample and position; row ``i`` drives sample
    ``i``); returns ``(b, block_size)`` int64 ids on the host: the prompt, the sampled
    ids, BOS from the first sampled BOS on.

    Position ``p`` feeds the token at ``p`` and draws the one at ``p + 1`` with
    ``uniforms[:, p]``; the draws of the prompt's positions are made and replaced by the
    prompt (so a sample's draws do not depend on the prompt's length). The loop stops
    once every row has sampled BOS (unless ``early_stop=False``, which always runs
    ``block_size`` positions, as a benchmark does). Each position is one call of a
    function of fixed shapes (the KV cache is preallocated), compiled once per batch size
    where the namespace has a compiler and ``jit`` allows (see :func:`microgpt_xp.score`).

    A temperature so small that logits divided by it could overflow the params' dtype
    (``inv_temperature`` above its largest value over :data:`LOGIT_BOUND`: below about
    3e-35 in float32, 6e-305 in float64) draws the argmax at every position instead, the
    limit of sampling as the temperature goes to 0 (ties, if any, are drawn among).
    """
    xp, backend, dev = params.xp, params.backend, params.device
    compile_fn = _xp.compiler(backend, jit)
    t = params.config.block_size
    b = uniforms.shape[0]
    dtype = _xp.dtype_name(params.wte)
    u = _xp.asarray(uniforms, backend, device=dev, dtype=dtype)
    token = _xp.asarray(np.full(b, bos, dtype=np.int64), backend, device=dev)
    bos_id = P.full((), bos, token)
    greedy = not inv_temperature * LOGIT_BOUND <= float(np.finfo(dtype).max)
    inv_t = P.full((), 1.0 if greedy else inv_temperature, params.wte)
    done = token != token
    cache = KVCache.zeros(params, b)
    k = None if top_k is None or top_k >= params.config.vocab_size else top_k
    if compile_fn is None and writable_cache(cache):
        return _decode_in_place(
            params,
            cache,
            (token, u, done),
            (bos, bos_id, inv_t),
            prompt,
            early_stop,
            greedy=greedy,
            top_k=k,
        )
    step = _position_fn(greedy, k)
    step = step if compile_fn is None else _xp.compiled(step, backend)
    rows = []
    for pos in range(t):
        token, cache, done, row = step(params, cache, token, u[:, pos], done, bos_id, inv_t)
        if pos < len(prompt):  # the prompt's token, not the draw
            token = row = P.full((b,), prompt[pos], token)
            done = token != token
        rows.append(row)
        if early_stop and pos >= len(prompt) and _xp.read_scalar(xp.all(done), bool):
            break
    ids = _xp.to_numpy(xp.stack(rows, axis=1))
    full = np.full((b, t), bos, dtype=np.int64)
    full[:, : ids.shape[1]] = ids
    return full


@functools.cache
def _position_fn(greedy: bool, top_k: int | None) -> Callable[..., Any]:
    """:func:`_position` with its static choices bound (one object per choice, so that a
    compiled version is built once)."""
    return functools.partial(_position, greedy=greedy, top_k=top_k)


def _position(
    params: Params,
    cache: KVCache,
    token: Any,
    u: Any,
    done: Any,
    bos: Any,
    inv_t: Any,
    *,
    greedy: bool,
    top_k: int | None,
) -> tuple[Any, KVCache, Any, Any]:
    """One position of :func:`decode_batch`: ``token (B,)`` in, the next ``token``, the
    cache, ``done (B,)`` (rows that have drawn BOS) and the ``row (B,)`` to record (BOS from
    a row's first BOS on). ``u (B,)`` uniforms, ``bos`` and ``inv_t`` 0-d arrays. With
    ``greedy``, the largest logit is drawn (``u`` draws among ties). ``top_k`` keeps the
    ``k`` largest logits of each row (and ties with the ``k``-th)."""
    # the ids are the model's own draws (checked once, at the start, by bos)
    x_t, cache = decode_hidden(params, token, cache)
    token, done, row = _draw(params, x_t, u, done, bos, inv_t, greedy=greedy, top_k=top_k)
    return token, cache, done, row


def _draw(
    params: Params,
    x_t: Any,
    u: Any,
    done: Any,
    bos: Any,
    inv_t: Any,
    *,
    greedy: bool,
    top_k: int | None,
) -> tuple[Any, Any, Any]:
    """The draw of :func:`_position` from the last hidden state ``x_t (C, B)``: ``(token,
    done, row)``."""
    xp = params.xp
    # logits / temperature = (lm_head / temperature) @ x_t, laid out (V, B), so that the
    # softmax and the draw reduce over the leading axis; the draw is scale-free, so it
    # takes softmax's exponentials unnormalised
    z = (params.lm_head @ x_t) if greedy else (params.lm_head * inv_t) @ x_t
    top = xp.max(z, axis=0, keepdims=True)
    weights = xp.astype(z == top, z.dtype) if greedy else xp.exp(z - top)
    if top_k is not None:
        kth = xp.sort(z, axis=0)[-top_k : 1 - top_k or None, :]
        weights = xp.where(z >= kth, weights, xp.zeros_like(weights))
    token = choose_columns(weights, u)
    done = done | (token == bos)
    return token, done, xp.where(done, bos, token)


def _decode_in_place(
    params: Params,
    cache: KVCache,
    state: tuple[Any, Any, Any],
    bos: tuple[int, Any, Any],
    prompt: Sequence[int],
    early_stop: bool,
    **choice: Any,
) -> np.ndarray:
    """:func:`decode_batch` on an eager namespace whose arrays can be written: each
    position writes its cache slot in place and attends over the slots so far
    (:func:`~microgpt_xp.model.decode_hidden_into`); with ``early_stop``, once a quarter
    of the rows still in the batch have drawn BOS they leave it (their later ids are
    BOS). ``state`` is ``(token, u, done)``, ``bos`` the BOS id as an int and a 0-d array
    and the inverse temperature; ``choice`` the draw's ``greedy`` and ``top_k``. A row's
    sums do not depend on the other rows, so the ids are those of the loop of
    :func:`decode_batch`. Returns ``(b, block_size)`` int64 host ids."""
    xp = params.xp
    token, u, done = state
    bos_int, bos_id, inv_t = bos
    b, t = u.shape
    out = np.full((b, t), bos_int, dtype=np.int64)
    rows = np.arange(b)  # the rows of `out` still in the batch
    for pos in range(t):
        x_t = decode_hidden_into(params, token, cache, pos)
        token, done, row = _draw(params, x_t, u[:, pos], done, bos_id, inv_t, **choice)
        if pos < len(prompt):  # the prompt's token, not the draw
            token = row = P.full((rows.shape[0],), prompt[pos], token)
            done = token != token
        out[rows, pos] = _xp.to_numpy(row)
        if not early_stop or pos < len(prompt) or pos + 1 == t:
            continue
        running = ~_xp.to_numpy(done)
        if not running.any():
            break
        if 4 * int(running.sum()) <= 3 * rows.shape[0]:
            keep = np.flatnonzero(running)
            rows = rows[keep]
            idx = _xp.asarray(keep, params.backend, device=params.device)
            token, u, done = (xp.take(a, idx, axis=0) for a in (token, u, done))
            cache = KVCache(
                tuple(_keep_columns(xp, a, idx, pos + 1) for a in cache.keys),
                tuple(_keep_columns(xp, a, idx, pos + 1) for a in cache.values),
                cache.pos,
            )
    return out


def _keep_columns(xp: Any, buf: Any, idx: Any, filled: int) -> Any:
    """A new ``(P, C, len(idx))`` buffer holding columns ``idx`` of ``buf (P, C, B)`` in
    its first ``filled`` slots (the later ones are written before they are read)."""
    new = xp.empty_like(buf[:, :, : idx.shape[0]])
    new[:filled, ...] = xp.take(buf[:filled, ...], idx, axis=2)
    return new


def decode_hidden_into(params: Params, token_ids: Any, cache: KVCache, pos: int) -> Any:
    """:func:`~microgpt_xp.model.decode_hidden` for an eager namespace whose arrays can be
    written, the sampler's own fast path (the model itself never writes an array; see
    :func:`writable_cache`), at the Python int position ``pos``: writes the position's key
    and value into slot ``pos`` of the cache's buffers *in place* and attends over slots
    ``0..pos`` only (views), so a position costs O(pos) instead of O(block_size) and
    allocates no cache. Returns ``x_t (C, B)``; ``cache.pos`` is neither read nor
    advanced. The sums are ``decode_hidden``'s (its hidden slots add exact zeros after
    the visible ones), so the ids sampled from it are the same."""
    cfg = params.config
    xp = params.xp
    c = cfg.n_embd
    wpe_t = xp.matrix_transpose(params.wpe[pos : pos + 1, :])  # (C, 1)
    x = L.rmsnorm_columns(xp.take(xp.matrix_transpose(params.wte), token_ids, axis=1) + wpe_t, c)
    for layer in range(cfg.n_layer):
        qkv = qkv_weight(params, layer) @ L.rmsnorm_columns(x, c)
        keys, values = cache.keys[layer], cache.values[layer]
        keys[pos, ...] = qkv[c : 2 * c, :]
        values[pos, ...] = qkv[2 * c :, :]
        y = L.decode_attention(
            qkv[:c, :],
            keys[: pos + 1, ...],
            values[: pos + 1, ...],
            None,
            n_head=cfg.n_head,
            head_dim=cfg.head_dim,
            slots=pos + 1,
        )
        x = x + params.attn_wo[layer, ...] @ y
        h = params.mlp_fc1[layer, ...] @ L.rmsnorm_columns(x, c)
        x = x + params.mlp_fc2[layer, ...] @ xp.maximum(h, P.full((), 0.0, h))  # ReLU
    return x


def writable_cache(cache: KVCache) -> bool:
    """Whether :func:`decode_hidden_into` can run on ``cache``: eager arrays that can be
    written in place (NumPy, PyTorch, CuPy, array-api-strict; not JAX's, not Dask's)."""
    from array_api_compat import is_lazy_array, is_writeable_array

    return bool(is_writeable_array(cache.keys[0]) and not is_lazy_array(cache.keys[0]))


# -- the draws ------------------------------------------------------------------------------
def row_uniforms(seed: int, start: int, stop: int, width: int) -> np.ndarray:
    """Rows ``start .. stop - 1`` of ``numpy.random.default_rng(seed).random((N, width))``
    for any ``N >= stop``, without drawing the rows before them (the PCG64 stream is
    advanced by ``start * width`` draws). These are the uniforms sampling uses, so a
    chunk of samples needs O(chunk) memory."""
    bits = np.random.PCG64(seed)  # what default_rng(seed) wraps
    bits.advance(start * width)
    return np.random.Generator(bits).random((stop - start, width))
