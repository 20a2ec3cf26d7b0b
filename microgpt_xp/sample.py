"""Batched generation through the KV cache (temperature, top-k, a prompt): the one decode loop
:func:`_decode`, for batches through ``runner.map`` and for streams of text (``length=N``)."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import numbers
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypedDict, overload

import numpy as np

from . import _xp, runners
from . import primitives as P
from ._errors import ArgumentTypeError, ArgumentValueError
from ._xp import array_namespace
from .data import Tokenizer, check_tokenizer
from .model import KVCache, decode_hidden
from .params import Params, flatten

if TYPE_CHECKING:
    from typing_extensions import Unpack


#: Below a temperature of ``LOGIT_BOUND / finfo(dtype).max`` sampling draws the argmax.
LOGIT_BOUND = 1e4

#: Samples generated at once by default (``python -m benchmarks.e2e sample``).
DEFAULT_BATCH_SIZE = 1_000


class SampleOptions(TypedDict, total=False):
    """The sampling options: ``temperature`` (> 0, default 0.5); ``seed`` (default 0: sample
    ``i`` uses row ``i`` of ``default_rng(seed).random((N, block_size))``); ``top_k`` (ties
    kept); ``prompt`` (ids, text for :func:`sample`); ``batch_size``; ``runner`` or its
    spellings ``chunks``, ``workers``, ``jit``."""

    temperature: float
    seed: int
    top_k: int | None
    prompt: Any
    batch_size: int | None
    runner: runners.Runner | None
    chunks: int | None
    workers: int | None
    jit: bool | None


def iter_sample_tokens(
    params: Params,
    bos: int,
    num_samples: int,
    *,
    length: int | None = None,
    **options: Unpack[SampleOptions],
) -> Iterator[np.ndarray]:
    """``num_samples`` sequences from BOS (then the prompt) as ``(b, block_size)`` int64 host
    batches, BOS from the first sampled BOS on; the same ids for a seed whatever the batching.
    ``length=N``: streams instead, in this process, as 1-d int64 pieces (a row's prompt, then
    its ``N`` ids one at a time). Checked now, run as batches are taken."""
    unknown = set(options) - set(SampleOptions.__annotations__)
    if unknown:
        raise TypeError(f"unexpected sampling options {sorted(unknown)}")
    _xp.check_positive_int(num_samples, "num_samples")
    cfg, xp = params.config, params.xp
    if _xp.read_scalar(xp.all(xp.isfinite(flatten(params))), bool) is False:
        raise ValueError("params hold weights that are not finite (NaN or inf): nothing to sample")
    if not 0 <= bos < cfg.vocab_size:
        raise ArgumentValueError("bos", f"bos id {bos} is outside [0, {cfg.vocab_size})")
    temperature = options.get("temperature", 0.5)
    real = isinstance(temperature, numbers.Real) and not isinstance(temperature, bool)
    if not (real and math.isfinite(float(temperature)) and float(temperature) > 0):
        raise ArgumentValueError("temperature", f"temperature must be > 0, got {temperature!r}")
    inv_t = 1.0 / float(temperature)
    seed = options.get("seed", 0)
    _xp.check_nonnegative_int(seed, "seed")
    top_k, chunks = options.get("top_k"), options.get("chunks")
    batch_size = options.get("batch_size")
    batch_size = DEFAULT_BATCH_SIZE if batch_size is None else batch_size
    sizes = {"top_k": top_k, "batch_size": batch_size, "chunks": chunks, "length": length}
    for name, value in sizes.items():
        if value is not None:
            _xp.check_positive_int(value, name, most=_xp.NATIVE_INT_MAX)
    prompt = tuple(int(i) for i in (options.get("prompt") or ()))
    if any(not 0 <= i < cfg.vocab_size or i == bos for i in prompt):
        raise ArgumentValueError(
            "prompt", f"prompt ids not in [0, {cfg.vocab_size}) or BOS: {prompt}"
        )
    if len(prompt) >= cfg.block_size:
        raise ArgumentValueError(
            "prompt", f"a prompt of {len(prompt)} ids leaves no position to sample"
        )
    runner = runners.pick(
        options.get("runner"),
        params.backend,
        workers=options.get("workers"),
        chunk_size=chunks,
        jit=options.get("jit"),
    )
    if length is not None and not isinstance(runner, runners.Local):
        runner.close()
        msg = f"length={length} streams are drawn in this process: {runner!r} cannot run them"
        raise ArgumentValueError("length", msg)
    params = runner.place(params)
    kw: dict[str, Any] = {"prompt": prompt, "top_k": top_k, "jit": runner.jit}

    def batches() -> Iterator[np.ndarray]:
        try:  # a range, not a list of bounds: O(batch) memory for any number of samples
            for a in range(0, num_samples, batch_size):
                u = row_uniforms(seed, a, min(a + batch_size, num_samples), cfg.block_size)
                yield np.concatenate(runner.map(_decode_rows, params, [u], bos, inv_t, kw))
        finally:
            runner.close()

    def streams(length: int) -> Iterator[np.ndarray]:
        try:
            for r in range(num_samples):
                if prompt:
                    yield np.asarray(prompt, dtype=np.int64)
                u = stream_uniforms(seed, r, cfg.block_size)
                steps = _decode(params, bos, u, inv_t, prompt, top_k, runner.jit, length=length)
                yield from (ids for _, _, ids in steps)
        finally:
            runner.close()

    return batches() if length is None else streams(length)


def sample_tokens(
    params: Params,
    bos: int,
    num_samples: int,
    *,
    length: int | None = None,
    **options: Unpack[SampleOptions],
) -> np.ndarray:
    """:func:`iter_sample_tokens`'s batches as one ``(N, block_size)`` int64 host array;
    with ``length``, its streams as ``(N, len(prompt) + length)``."""
    batches = iter_sample_tokens(params, bos, num_samples, length=length, **options)
    ids = np.concatenate(list(batches), axis=0)
    return ids if length is None else ids.reshape(num_samples, -1)


@overload
def iter_samples(
    params: Params,
    tokenizer: Tokenizer,
    num_samples: int,
    *,
    length: None = None,
    **options: Unpack[SampleOptions],
) -> Iterator[list[str]]: ...
@overload
def iter_samples(
    params: Params,
    tokenizer: Tokenizer,
    num_samples: int,
    *,
    length: int,
    **options: Unpack[SampleOptions],
) -> Iterator[str]: ...
def iter_samples(
    params: Params,
    tokenizer: Tokenizer,
    num_samples: int,
    *,
    length: int | None = None,
    **options: Unpack[SampleOptions],
) -> Iterator[list[str]] | Iterator[str]:
    """:func:`iter_sample_tokens` as text (``prompt`` is text): a list of names per batch, or
    with ``length=N`` the text pieces as drawn.

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
    check_tokenizer(tokenizer, params.config.vocab_size)
    prompt = options.get("prompt")
    if prompt is not None:
        if not isinstance(prompt, str):
            raise ArgumentTypeError("prompt", f"prompt must be text, got {type(prompt).__name__}")
        options = {**options, "prompt": tokenizer.encode(prompt)}
    batches = iter_sample_tokens(params, tokenizer.bos, num_samples, length=length, **options)
    if length is None:
        return (tokenizer.decode_rows(ids) for ids in batches)
    chars = tokenizer.chars  # a stream writes no BOS
    return ("".join([chars[i] for i in ids.tolist()]) for ids in batches)


def sample(
    params: Params,
    tokenizer: Tokenizer,
    num_samples: int = 20,
    *,
    length: int | None = None,
    **options: Unpack[SampleOptions],
) -> list[str]:
    """``num_samples`` documents (names), or with ``length=N`` streams of text of ``prompt`` and
    ``N`` characters (:func:`iter_sample_tokens`).

    >>> import microgpt_xp as mx
    >>> tokenizer = mx.Tokenizer("ab")
    >>> params = mx.init_params(mx.GPTConfig(tokenizer.vocab_size, block_size=4), seed=0)
    >>> names = mx.sample(params, tokenizer, 3, seed=1, prompt="a")
    >>> texts = mx.sample(params, tokenizer, 3, seed=1, prompt="a", length=20)
    >>> [len(text) for text in texts], [t.startswith(n) for t, n in zip(texts, names)]
    ([21, 21, 21], [True, True, True])
    """
    if length is None:
        return [
            name
            for names in iter_samples(params, tokenizer, num_samples, **options)
            for name in names
        ]
    text = "".join(iter_samples(params, tokenizer, num_samples, length=length, **options))
    n = len(text) // num_samples
    return [text[i : i + n] for i in range(0, len(text), n)]


def choose(probs: Any, u: Any) -> Any:
    """``(B,)`` int64 inverse-CDF draws as ``random.choices`` makes them, of ``probs (B, V)``
    (unnormalised), ``u (B,)`` in ``[0, 1)``: how many of ``c[0..V-2]`` are ``<= u * c[V-1]``."""
    xp = array_namespace(probs, u)
    return choose_columns(xp.matrix_transpose(probs), u)


def choose_columns(probs_t: Any, u: Any) -> Any:
    """:func:`choose` of probabilities laid out ``(V, B)``, one column per draw."""
    c = P.cumulative_sum0(probs_t)
    hits = c[:-1, :] <= (u * c[-1, :])[None, :]
    xp = array_namespace(hits)
    # counted in c's float dtype (exact: at most V - 1) by sum_first: onnxruntime's integer
    # ReduceSum over the leading axis took 5x as long (a 16th of the generate graph's time)
    return xp.astype(P.sum_first(xp.astype(hits, c.dtype))[0, :], xp.int64)


def _decode_rows(params: Params, uniforms: np.ndarray, bos: int, inv_t: float, kw: Any) -> Any:
    """:func:`decode_batch` with the rows first (the shape a runner's ``map`` calls)."""
    return decode_batch(params, bos, uniforms, inv_t, **kw)


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
    """One batch from BOS (then ``prompt``): host ``uniforms (b, block_size)`` -> ``(b,
    block_size)`` int64 host ids; position ``p`` draws with ``uniforms[:, p]``. ``early_stop``:
    stop once every row drew BOS; a temperature low enough to overflow the logits: the argmax."""
    b, t = uniforms.shape
    out = np.full((b, t), bos, dtype=np.int64)
    steps = _decode(params, bos, iter([uniforms]), inv_temperature, prompt, top_k, jit, early_stop)
    for pos, rows, ids in steps:
        out[rows, pos] = ids
    return out


def _decode(
    params: Params,
    bos: int,
    uniforms: Iterator[np.ndarray],
    inv_temperature: float,
    prompt: Sequence[int],
    top_k: int | None,
    jit: bool | None,
    early_stop: bool = True,
    length: int | None = None,
) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """The one decode loop, yielding ``(step, rows, ids)``: of a batch (one chunk of uniforms),
    the ids of the ``rows`` still running; of a stream (``length``), one row's drawn ids,
    ``(1,)`` each, its window sliding by ``block_size // 2`` and restarting after a BOS."""
    xp, backend, dev = params.xp, params.backend, params.device
    compile_fn = _xp.compiler(backend, jit)
    host_u = next(uniforms)
    b, t = host_u.shape
    dtype = _xp.dtype_name(params.wte)
    u = _xp.asarray(host_u, backend, device=dev, dtype=dtype)
    token = _xp.asarray(np.full(b, bos, dtype=np.int64), backend, device=dev)
    bos_id = P.full((), bos, token)
    greedy = not inv_temperature * LOGIT_BOUND <= float(np.finfo(dtype).max)
    inv_t = P.full((), 1.0 if greedy else inv_temperature, params.wte)
    done = token != token
    step = _position_fn(
        greedy, None if top_k is None or top_k >= params.config.vocab_size else top_k
    )
    cache = KVCache.zeros(params, b)
    if compile_fn is None:
        cache = dataclasses.replace(cache, pos=0)
    else:
        step = _xp.compiled(step, backend)
    zero = cache.pos  # position 0: where a stream's slide or restart goes back to
    shrink = early_stop and compile_fn is None and P.writable(cache.keys[0])
    rows = np.arange(b)  # the rows of `out` still in the batch
    block, window = params.config.block_size, max(1, params.config.block_size // 2)
    feed, context, filled, written = list(prompt), list(prompt), 0, 0  # a stream's state
    for pos in range(t) if length is None else itertools.count():
        if pos and not pos % t:  # a stream's next chunk of uniforms
            u = _xp.asarray(next(uniforms), backend, device=dev, dtype=dtype)
        token, cache, done, row = step(params, cache, token, u[:, pos % t], done, bos_id, inv_t)
        if length is not None:
            filled += 1
            if feed:  # the prompt's or the window's next id, not the draw
                token = P.full((1,), feed.pop(0), token)
            elif (ids := _xp.to_numpy(token))[0] == bos:  # BOS (the token) at position 0
                cache, filled, context = dataclasses.replace(cache, pos=zero), 0, []
                continue
            else:
                yield pos, rows, ids
                if (written := written + 1) == length:
                    return
                context.append(int(ids[0]))
            if filled == block:  # the window slides: its last half from position 0
                context, filled = context[-window:], 0
                cache = dataclasses.replace(cache, pos=zero)
                token, feed = P.full((1,), context[0], token), context[1:]
            continue
        if pos < len(prompt):  # the prompt's token, not the draw
            token = row = P.full((rows.shape[0],), prompt[pos], token)
            done = token != token
        yield pos, rows, _xp.to_numpy(row)
        if not early_stop or pos < len(prompt) or pos + 1 == t:
            continue
        running = ~_xp.to_numpy(done)
        if not running.any():
            break
        if shrink and 4 * int(running.sum()) <= 3 * rows.shape[0]:
            keep = np.flatnonzero(running)
            rows = rows[keep]
            idx = _xp.asarray(keep, backend, device=dev)
            token, u, done = (xp.take(a, idx, axis=0) for a in (token, u, done))
            keys, values = (
                tuple(P.keep_columns(a, idx, pos + 1) for a in bufs)
                for bufs in (cache.keys, cache.values)
            )
            cache = KVCache(keys, values, cache.pos)


@functools.cache
def _position_fn(greedy: bool, top_k: int | None) -> Callable[..., Any]:
    """:func:`_position` with its static choices bound, one object each (compiled once)."""
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
    """One position: ``token (B,)``, ``u (B,)`` -> the next ``token``, the cache, ``done (B,)``
    (rows that drew BOS) and the ``row (B,)`` to record; ``bos``, ``inv_t`` 0-d arrays."""
    xp = params.xp
    x_t, cache = decode_hidden(params, token, cache)  # the model's own draws: no checks
    # logits / temperature laid out (V, B); the draw is scale-free (unnormalised exp)
    z = P.matmul(params.lm_head if greedy else params.lm_head * inv_t, x_t)
    top = P.max_first(z)
    weights = xp.astype(z == top, z.dtype) if greedy else xp.exp(z - top)
    if top_k is not None:
        kth = xp.sort(z, axis=0)[-top_k : 1 - top_k or None, :]
        weights = xp.where(z >= kth, weights, xp.zeros_like(weights))
    token = choose_columns(weights, u)
    done = done | (token == bos)
    return token, cache, done, xp.where(done, bos, token)


def row_uniforms(seed: int, start: int, stop: int, width: int) -> np.ndarray:
    """Rows ``start .. stop - 1`` of ``default_rng(seed).random((N, width))``, undrawn before."""
    bits = np.random.PCG64(seed)  # what default_rng(seed) wraps
    bits.advance(start * width)
    return np.random.Generator(bits).random((stop - start, width))


def stream_uniforms(seed: int, row: int, width: int) -> Iterator[np.ndarray]:
    """Stream ``row``'s uniforms in ``(1, width)`` chunks: document mode's row, then those of
    ``PCG64(seed).jumped(row + 1)``."""
    yield row_uniforms(seed, row, row + 1, width)
    rng = np.random.Generator(np.random.PCG64(seed).jumped(row + 1))
    while True:
        yield rng.random((1, width))
