"""The GPT: whole-sequence ``forward``, token-by-token ``decode_step`` with a ``KVCache``,
``loss_and_grads`` (the hand-written backward pass) and per-document ``score``.

All of it is composed from the forward/backward pairs in :mod:`microgpt_xp.layers` and
runs on whatever namespace and device the inputs live on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from array_api_compat import device

from . import _procs, _threads, _xp
from . import layers as L
from ._xp import array_namespace
from .config import GPTConfig
from .params import FIELDS, LAYER_FIELDS, Params

Array = Any
Reduction = Literal["mean", "token_mean"]


# -- input checks (at the edge, before any model code) -----------------------------------
def _check_same_place(params: Params, arrays: dict[str, Array]) -> Any:
    for name, a in arrays.items():
        try:
            xp = array_namespace(a, params.wte)
        except TypeError as exc:
            raise TypeError(
                f"{name} and params are arrays of different namespaces "
                f"({type(a).__module__}.{type(a).__name__} vs {params.backend}): {exc}"
            ) from exc
        # traced (jax.jit) arrays have no device; they are placed by the tracer
        if (
            device(a) is not None
            and params.device is not None
            and str(device(a)) != str(params.device)
        ):
            raise ValueError(f"{name} is on device {device(a)} but params are on {params.device}")
    return xp


def _eager_values(x: Array) -> np.ndarray | None:
    """Host values of an eager array for validation; ``None`` for lazy arrays."""
    if _xp.is_lazy(x):
        return None
    return _xp.to_numpy(x)


def _check_tokens(
    params: Params, tokens: Array, lengths: Array | None, *, max_len: int, min_length: int
) -> tuple[Array, Array]:
    """Validate ``tokens (B, T)`` / ``lengths (B,)`` and return them (lengths filled in).

    Value checks (ids in range, lengths that fit) run on eager arrays; on Dask they are
    attached to the graph and raise when computed.
    """
    if not hasattr(tokens, "shape") or not hasattr(tokens, "dtype"):
        raise TypeError(f"tokens must be an array, got {type(tokens).__name__}")
    xp = _check_same_place(params, {"tokens": tokens})
    if not _xp.is_integral(xp, tokens.dtype):
        raise TypeError(f"tokens must have an integer dtype, got {tokens.dtype}")
    if tokens.ndim != 2:
        raise ValueError(f"tokens must be 2-d (batch, time), got shape {tuple(tokens.shape)}")
    b, t = tokens.shape
    if t > max_len:
        raise ValueError(f"sequence length {t} exceeds the model's limit {max_len}")
    if t < min_length:
        raise ValueError(f"sequences need at least {min_length} tokens, got {t}")
    if lengths is None:
        lengths = xp.full((b,), t, dtype=tokens.dtype, device=device(tokens))
    else:
        _check_same_place(params, {"lengths": lengths})
        if not _xp.is_integral(xp, lengths.dtype):
            raise TypeError(f"lengths must have an integer dtype, got {lengths.dtype}")
        if tuple(lengths.shape) != (b,):
            raise ValueError(
                f"lengths must have shape ({b},) to match tokens, got {tuple(lengths.shape)}"
            )
    vocab = params.config.vocab_size
    tok_host, len_host = _eager_values(tokens), _eager_values(lengths)
    if (
        len_host is not None
        and len_host.size
        and (len_host.min() < min_length or len_host.max() > t)
    ):
        raise ValueError(
            f"lengths must lie in [{min_length}, {t}] for tokens of shape {(b, t)}, "
            f"got min {len_host.min()} max {len_host.max()}"
        )
    if (
        tok_host is not None
        and len_host is not None
        and tok_host.size
        and (tok_host.min() < 0 or tok_host.max() >= vocab)
    ):
        # out-of-range ids are allowed in the padding: look for one at a real position
        real = np.arange(t)[None, :] < len_host[:, None]
        bad = real & ((tok_host < 0) | (tok_host >= vocab))
        if bad.any():
            row, col = np.argwhere(bad)[0]
            raise ValueError(
                f"token id {tok_host[row, col]} at [{row}, {col}] is outside [0, {vocab})"
            )
    if _xp.is_lazy(tokens) or _xp.is_lazy(lengths):
        tokens = _xp.lazy_value_check(
            tokens,
            lambda blk: bool(((blk >= 0) & (blk < vocab)).all()) if blk.size else True,
            f"token ids must lie in [0, {vocab}) (padding included, on lazy arrays)",
        )
        lengths = _xp.lazy_value_check(
            lengths,
            lambda blk: bool(((blk >= min_length) & (blk <= t)).all()) if blk.size else True,
            f"lengths must lie in [{min_length}, {t}] for tokens of shape {(b, t)} (on lazy arrays)",
        )
    return tokens, lengths


def _real_mask(lengths: Array, t: int, dtype: Any) -> Array:
    """``(B, T)`` 1.0 at positions ``< lengths[b]``, else 0.0."""
    xp = array_namespace(lengths)
    pos = xp.arange(t, dtype=lengths.dtype, device=device(lengths))
    return xp.astype(pos[None, :] < lengths[:, None], dtype)


# -- forward and backward over whole sequences ---------------------------------------------
def _qkv_weight(params: Params, layer: int) -> Array:
    xp = params.xp
    return xp.concat(
        [params.attn_wq[layer, ...], params.attn_wk[layer, ...], params.attn_wv[layer, ...]], axis=0
    )


def _mlp_forward(params: Params, layer: int, x: Array) -> tuple[Array, tuple[Any, ...]]:
    """The MLP sub-block with its residual: ``x + fc2(relu(fc1(rmsnorm(x))))`` for
    ``x (N, C)``; returns the new ``x`` and the caches of its four blocks."""
    h, c_norm = L.rmsnorm_forward(x)
    u, c_fc1 = L.linear_forward(h, params.mlp_fc1[layer, ...])
    u, c_relu = L.relu_forward(u)
    m, c_fc2 = L.linear_forward(u, params.mlp_fc2[layer, ...])
    return x + m, (c_norm, c_fc1, c_relu, c_fc2)


def _forward_cached(params: Params, tokens: Array) -> tuple[Array, list[Any]]:
    """The last hidden state ``(B*T, C)`` of valid ``tokens (B, T)`` (the input of
    ``lm_head``) and the caches of the blocks for :func:`_backward`."""
    cfg = params.config
    b, t = tokens.shape
    e, c_emb = L.embedding_forward(tokens, params.wte, params.wpe[:t, :])
    x, c_norm0 = L.rmsnorm_forward(e)
    caches: list[Any] = [c_emb, c_norm0]
    for layer in range(cfg.n_layer):
        h, c1 = L.rmsnorm_forward(x)
        qkv, c2 = L.linear_forward(h, _qkv_weight(params, layer))
        a, c3 = L.causal_attention_forward(qkv, b, t, cfg.n_head)
        o, c4 = L.linear_forward(a, params.attn_wo[layer, ...])
        x = x + o
        x, (c5, c6, c7, c8) = _mlp_forward(params, layer, x)
        caches.append((c1, c2, c3, c4, c5, c6, c7, c8))
    return x, caches


def _backward(params: Params, dx: Array, caches: list[Any]) -> dict[str, Array]:
    """Gradients of every weight but ``lm_head`` from ``dx (B*T, C)``, the gradient of the
    last hidden state, walking the caches in reverse."""
    xp = params.xp
    cfg = params.config
    c = cfg.n_embd
    per_layer: dict[str, list[Array]] = {name: [] for name in LAYER_FIELDS}
    for layer in reversed(range(cfg.n_layer)):
        c1, c2, c3, c4, c5, c6, c7, c8 = caches[2 + layer]
        du, dfc2 = L.linear_backward(dx, c8)
        dh, dfc1 = L.linear_backward(L.relu_backward(du, c7), c6)
        dx = dx + L.rmsnorm_backward(dh, c5)
        da, dwo = L.linear_backward(dx, c4)
        dh, dwqkv = L.linear_backward(L.causal_attention_backward(da, c3), c2)
        dx = dx + L.rmsnorm_backward(dh, c1)
        for name, g in (
            ("attn_wq", dwqkv[:c, :]),
            ("attn_wk", dwqkv[c : 2 * c, :]),
            ("attn_wv", dwqkv[2 * c :, :]),
            ("attn_wo", dwo),
            ("mlp_fc1", dfc1),
            ("mlp_fc2", dfc2),
        ):
            per_layer[name].insert(0, g)
    de = L.rmsnorm_backward(dx, caches[1])
    dwte, dwpe_rows = L.embedding_backward(de, caches[0])
    t = dwpe_rows.shape[0]
    dwpe = dwpe_rows
    if t < cfg.block_size:
        # zero rows for the unused positions, as a one-hot product rather than a concat:
        # on Dask a concat would leave wpe's gradient (and so wpe) in two chunks, and the
        # position slices of later steps would then split every activation along T
        positions = xp.arange(t, device=device(dwpe_rows))
        dwpe = L.one_hot(positions, cfg.block_size, dwpe_rows.dtype, axis=0) @ dwpe_rows
    grads = {"wte": dwte, "wpe": dwpe}
    grads.update({name: _stack_layers(gs) for name, gs in per_layer.items()})
    return grads


def _stack_layers(per_layer: list[Array]) -> Array:
    """``L`` arrays ``(…)`` -> ``(L, …)`` (a view, not a copy, for a single layer)."""
    xp = array_namespace(per_layer[0])
    if len(per_layer) == 1:
        return xp.reshape(per_layer[0], (1, *per_layer[0].shape))
    return xp.stack(per_layer, axis=0)


def _safe_tokens(tokens: Array, lengths: Array) -> Array:
    """Padding replaced by id 0, so that whatever the padding holds never reaches the model."""
    xp = array_namespace(tokens)
    real = _real_mask(lengths, tokens.shape[1], xp.bool)
    return xp.where(real, tokens, xp.zeros_like(tokens))


def forward(params: Params, tokens: Array, lengths: Array | None = None) -> Array:
    """Logits of every position of a right-padded batch.

    Args:
        params: the weights.
        tokens: ``(B, T)`` integer ids of the params' namespace and device, ``T <=
            block_size``, rows right-padded.
        lengths: ``(B,)`` integer number of real tokens per row (default: all ``T``).

    Returns:
        ``(B, T, V)`` logits in the params' dtype. Position ``t`` of row ``b`` sees
        tokens ``0..t`` of that row only, so the logits of real positions never depend
        on the padding (the logits at padded positions are meaningless).

    Raises ``TypeError``/``ValueError`` for tokens of another namespace or device, a
    non-integer dtype, ids outside ``[0, V)``, ``T > block_size`` or bad ``lengths``.
    """
    cfg = params.config
    tokens, lengths = _check_tokens(params, tokens, lengths, max_len=cfg.block_size, min_length=1)
    b, t = tokens.shape
    x, _ = _forward_cached(params, _safe_tokens(tokens, lengths))
    logits, _ = L.linear_forward(x, params.lm_head)
    return params.xp.reshape(logits, (b, t, cfg.vocab_size))


def _prediction_inputs(
    params: Params, tokens: Array, lengths: Array
) -> tuple[Array, Array, Array, Array]:
    """Split documents ``(B, L)`` into model inputs, targets and the per-row number of
    predictions ``n = min(lengths - 1, block_size)``; returns ``(inputs, targets, n, valid)``."""
    xp = params.xp
    cfg = params.config
    tokens, lengths = _check_tokens(
        params, tokens, lengths, max_len=cfg.block_size + 1, min_length=2
    )
    t = min(tokens.shape[1] - 1, cfg.block_size)
    safe = _safe_tokens(tokens, lengths)
    n = xp.minimum(lengths - 1, xp.full_like(lengths, cfg.block_size))
    valid = _real_mask(n, t, params.dtype)
    return safe[:, :t], safe[:, 1 : t + 1], n, valid


def _nll(
    params: Params, tokens: Array, lengths: Array
) -> tuple[Array, Array, Array, list[Any], Any]:
    """Per-position losses ``(B, T)`` (zero at padding, whatever the model predicts
    there), ``n (B,)``, ``valid (B, T)``,
    plus the caches of the forward pass and of the cross-entropy."""
    xp = params.xp
    inputs, targets, n, valid = _prediction_inputs(params, tokens, lengths)
    b, t = inputs.shape
    x, caches = _forward_cached(params, inputs)
    logits_t, c_head = L.linear_t_forward(x, params.lm_head)
    losses, c_ce = L.cross_entropy_forward(
        logits_t, xp.reshape(targets, (b * t,)), xp.reshape(valid, (b * t,))
    )
    return xp.reshape(losses, (b, t)), n, valid, [*caches, c_head], c_ce


def _row_weights(n: Array, valid: Array, reduction: Reduction) -> tuple[Array, Any]:
    """``(B, T)`` weight of each position in the batch loss; the per-row factor ``(B,)``
    or the scalar factor of a token mean."""
    xp = array_namespace(valid)
    if reduction == "mean":
        inv_n = 1.0 / xp.astype(n, valid.dtype)
        return valid * (inv_n * (1.0 / valid.shape[0]))[:, None], inv_n
    inv_total = 1.0 / xp.sum(valid)
    return valid * inv_total, inv_total


def loss_and_grads(
    params: Params,
    tokens: Array,
    lengths: Array,
    *,
    reduction: Reduction = "mean",
    workers: int | None = 1,
) -> tuple[Array, Params]:
    """The training loss of a batch of documents and its gradient (hand-written backward).

    Args:
        params: the weights.
        tokens: ``(B, L)`` integer ids, ``L <= block_size + 1``, each row ``BOS, chars…,
            BOS`` as the spec encodes a document, right-padded.
        lengths: ``(B,)`` real tokens per row, each ``>= 2``.
        reduction: ``"mean"`` (default): row ``b``'s loss is the mean of ``−log p(next
            token)`` over its ``n_b = min(lengths[b] − 1, block_size)`` predictions and the
            batch loss the mean of the rows' losses — exactly microgpt's loss when
            ``B = 1``. ``"token_mean"``: the mean over all predicted tokens of the batch,
            so long documents weigh more.
        workers: threads to split a NumPy batch over, by rows (``1``, the default: no
            split). ``None`` chooses by the batch's size and the usable CPU cores: on
            Linux, worker processes where the batch has enough work for two (see
            :func:`microgpt_xp._procs.plan`), else threads (see
            :func:`microgpt_xp._threads.plan`). Each thread or process computes its rows'
            loss and gradients, which are then averaged with the reduction's weights: the
            same values up to rounding, and the same bits for the same number of shards.
            Other namespaces run as one batch (Dask chunks and GPUs have their own
            parallelism).

    Returns:
        ``(loss, grads)``: ``loss`` a 0-d array of the params' namespace, ``grads`` a
        :class:`Params` of the same namespace, device and dtype. Rows of ``wte``/``wpe``
        the batch does not use get exactly zero gradient.
    """
    if reduction not in ("mean", "token_mean"):
        raise ValueError(f"reduction must be 'mean' or 'token_mean', got {reduction!r}")
    plan = _host_plan(params, tokens, workers, processes=True)
    if plan != _threads.UNCHANGED:
        return _threaded_loss_and_grads(params, tokens, lengths, reduction, plan)
    xp = params.xp
    losses, n, valid, caches, c_ce = _nll(params, tokens, lengths)
    weights, factor = _row_weights(n, valid, reduction)
    if reduction == "mean":
        loss = xp.mean(xp.sum(losses, axis=1) * factor)
    else:
        loss = xp.sum(losses) * factor
    dlogits_t = L.cross_entropy_backward(xp.reshape(weights, (-1,)), c_ce)
    dx, dlm_head = L.linear_t_backward(dlogits_t, caches[-1])
    grads = _backward(params, dx, caches[:-1])
    return loss, Params.trusted(params.config, {**grads, "lm_head": dlm_head})


def _host_plan(
    params: Params, tokens: Array, workers: int | None, *, processes: bool = False
) -> _threads.Plan:
    """How a batch of ``tokens`` runs with ``workers`` (see :func:`loss_and_grads`):
    :data:`~microgpt_xp._threads.UNCHANGED` unless the arrays are NumPy's and the plan
    shares the batch over threads, or (``processes=True``, ``workers=None``, Linux) over
    worker processes. Malformed tokens get the unchanged plan too, so that the plain
    path's checks report them."""
    _threads.check_workers(workers)
    if workers == 1 or not _xp.runs_on_host_threads(tokens) or tokens.ndim != 2:
        return _threads.UNCHANGED
    return sequence_plan(
        params.config, tokens.shape[0], tokens.shape[1], workers, processes=processes
    )


def sequence_plan(
    config: GPTConfig, rows: int, length: int, workers: int | None, *, processes: bool
) -> _threads.Plan:
    """The plan of a NumPy batch of ``rows`` documents of ``length`` tokens: with
    ``processes`` (training), ``workers=None`` and worker processes available, the
    :func:`microgpt_xp._procs.plan` when it has more than one shard; else the threads'
    :func:`microgpt_xp._threads.sequence_plan`."""
    if processes and workers is None and _procs.available():
        by_processes = _procs.plan(config, rows, length)
        if by_processes.shards > 1:
            return by_processes
    return _threads.sequence_plan(config, rows, length, workers)


def _on_row_shards(
    params: Params,
    tokens: Array,
    lengths: Array,
    plan: _threads.Plan,
    fn: Callable[[Array, Array, int, int], Any],
) -> list[Any]:
    """``fn(tokens, lengths, start, stop)`` of each row range of ``plan``, on its own
    thread, after checking the whole batch here (so that an error names its row in the
    batch, not in a shard); ``tokens`` and ``lengths`` are the checked arrays."""
    cfg = params.config
    tokens, lengths = _check_tokens(
        params, tokens, lengths, max_len=cfg.block_size + 1, min_length=2
    )
    return _threads.run(plan, lambda start, stop: fn(tokens, lengths, start, stop), tokens.shape[0])


def _threaded_loss_and_grads(
    params: Params, tokens: Array, lengths: Array, reduction: Reduction, plan: _threads.Plan
) -> tuple[Array, Params]:
    """:func:`loss_and_grads` run as ``plan`` says: its row ranges on their own threads
    (or worker processes), combined. The batch loss is the weighted sum of the shards'
    losses (weights: each shard's share of the rows for ``"mean"``, of the predicted
    tokens for ``"token_mean"``), and so are the gradients."""
    cfg = params.config

    def weight(lengths: Array, start: int, stop: int) -> float:
        if reduction == "mean":
            return (stop - start) / int(lengths.shape[0])
        n = np.minimum(_xp.to_numpy(lengths) - 1, cfg.block_size)
        return float(n[start:stop].sum() / n.sum())

    def shard(tokens: Array, lengths: Array, start: int, stop: int) -> tuple[float, Any, Any]:
        loss, grads = loss_and_grads(
            params, tokens[start:stop, ...], lengths[start:stop], reduction=reduction
        )
        return weight(lengths, start, stop), loss, grads

    if plan.processes:
        tokens, lengths = _check_tokens(
            params, tokens, lengths, max_len=cfg.block_size + 1, min_length=2
        )
        bounds = _threads.shard_bounds(tokens.shape[0], plan.shards)
        with _threads.blas_limit(plan.blas_threads):
            results = _procs.run(params, tokens, lengths, reduction, bounds)
        parts = [
            (weight(lengths, start, stop), loss, grads)
            for (start, stop), (loss, grads) in zip(bounds, results, strict=True)
        ]
    else:
        parts = _on_row_shards(params, tokens, lengths, plan, shard)
    weights, losses, shard_grads = zip(*parts, strict=True)

    def combine(values: list[Array]) -> Array:
        total = weights[0] * values[0]
        for w, value in zip(weights[1:], values[1:], strict=True):
            total = total + w * value
        return total

    loss = combine(list(losses))
    grads = {name: combine([getattr(g, name) for g in shard_grads]) for name in FIELDS}
    return loss, Params.trusted(cfg, grads)


def score(params: Params, tokens: Array, lengths: Array, *, workers: int | None = 1) -> Array:
    """Each document's mean negative log-likelihood per predicted token (the spec's loss
    of that document), with the same ``tokens (B, L)`` / ``lengths (B,)`` conventions as
    :func:`loss_and_grads`, ``workers`` included (a row's score does not depend on the
    threads). Returns ``(B,)`` in the params' dtype; lazy on Dask."""
    xp = params.xp
    plan = _host_plan(params, tokens, workers)
    if plan != _threads.UNCHANGED:
        parts = _on_row_shards(
            params,
            tokens,
            lengths,
            plan,
            lambda tok, lens, start, stop: score(params, tok[start:stop, ...], lens[start:stop]),
        )
        return xp.concat(parts, axis=0)
    losses, n, _, _, _ = _nll(params, tokens, lengths)
    return xp.sum(losses, axis=1) * (1.0 / xp.astype(n, losses.dtype))


# -- token-by-token decoding ----------------------------------------------------------------
@dataclass(frozen=True)
class KVCache:
    """Keys and values of the positions decoded so far, for a batch.

    ``keys[l]`` and ``values[l]`` are ``(pos, C, B)`` arrays of layer ``l``: positions
    first, then channels, with one column per sequence of the batch (empty tuples before
    the first step); each step appends one ``(1, C, B)`` slice. ``pos`` is the number of
    positions already decoded, which is also the position of the next token.
    """

    keys: tuple[Array, ...] = ()
    values: tuple[Array, ...] = ()
    pos: int = 0

    @classmethod
    def empty(cls) -> KVCache:
        """A cache for a fresh sequence (position 0)."""
        return cls()


def decode_step(params: Params, token_ids: Array, cache: KVCache) -> tuple[Array, KVCache]:
    """Run one position of the model for a batch, attending over the cache.

    Args:
        params: the weights.
        token_ids: ``(B,)`` integer ids at position ``cache.pos`` (same namespace/device).
        cache: the :class:`KVCache` of the earlier positions (``KVCache()`` to start).

    Returns:
        ``(logits (B, V), new_cache)``. The logits equal :func:`forward`'s at that position.
        This is the spec's token-by-token forward: the new key and value are appended
        before attending, so the position attends to itself.
    """
    cfg = params.config
    if not isinstance(cache, KVCache):
        raise TypeError(f"cache must be a KVCache, got {type(cache).__name__}")
    if cache.pos >= cfg.block_size:
        raise ValueError(
            f"the cache is full: position {cache.pos} is past block_size {cfg.block_size}"
        )
    if getattr(token_ids, "ndim", None) != 1:
        raise ValueError(
            f"token_ids must be 1-d (batch,), got {getattr(token_ids, 'shape', token_ids)}"
        )
    if cache.pos and tuple(cache.keys[0].shape[2:]) != tuple(token_ids.shape):
        raise ValueError(
            f"token_ids hold {token_ids.shape[0]} rows but the cache {cache.keys[0].shape[2]}"
        )
    # on Dask the value check rides along with the returned (lazy) ids
    checked, _ = _check_tokens(
        params, token_ids[:, None], None, max_len=cfg.block_size, min_length=1
    )
    x_t, new_cache = decode_hidden(params, checked[:, 0], cache)
    return params.xp.matrix_transpose(params.lm_head @ x_t), new_cache


def decode_hidden(params: Params, token_ids: Array, cache: KVCache) -> tuple[Array, KVCache]:
    """:func:`decode_step` up to the last hidden state, without the input checks (for ids
    the model itself sampled): returns ``(x_t (C, B), new_cache)``, one column per
    sequence, so that ``lm_head @ x_t`` gives the logits laid out ``(V, B)``.

    The whole step runs in this column layout: the linear layers are ``w @ x_t``, the
    norms and the attention's softmax reduce over leading axes (see
    :func:`~microgpt_xp.layers.decode_attention`), and the ``q``, ``k`` and ``v`` of a step
    are contiguous row blocks of one ``(3C, B)`` product.
    """
    cfg = params.config
    xp = params.xp
    pos, c = cache.pos, cfg.n_embd
    wte_t = xp.matrix_transpose(params.wte)
    x = L.rmsnorm_columns(xp.take(wte_t, token_ids, axis=1) + params.wpe[pos, :][:, None])
    keys, values = [], []
    for layer in range(cfg.n_layer):
        qkv = _qkv_weight(params, layer) @ L.rmsnorm_columns(x)
        k, v = qkv[None, c : 2 * c, :], qkv[None, 2 * c :, :]
        if pos:
            k = xp.concat([cache.keys[layer], k], axis=0)
            v = xp.concat([cache.values[layer], v], axis=0)
        keys.append(k)
        values.append(v)
        y = L.decode_attention(qkv[:c, :], k, v, cfg.n_head)
        x = x + params.attn_wo[layer, ...] @ y
        h = L.relu_forward(params.mlp_fc1[layer, ...] @ L.rmsnorm_columns(x))[0]
        x = x + params.mlp_fc2[layer, ...] @ h
    return x, KVCache(tuple(keys), tuple(values), pos + 1)
