"""The GPT: ``forward``, ``decode_step`` with a ``KVCache``, ``loss_and_grads`` (hand-written
backward), ``train_step`` and ``score``, on the inputs' namespace and device. Only the
config's sizes are Python ints (a symbolic batch and time may be unknown); each public
function checks its inputs once, at its start (:mod:`microgpt_xp._checks`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from . import _pytree, _xp
from . import layers as L
from . import primitives as P
from ._checks import check_reduction, check_tokens
from ._errors import ArgumentTypeError, ArgumentValueError
from .optim import AdamConfig, AdamState, adam_config, adam_update
from .params import LAYER_FIELDS, Params

Array = Any
Reduction = Literal["mean", "token_mean"]


def qkv_weight(params: Params, layer: int) -> Array:
    """``(3C, C)``: layer ``layer``'s query, key and value weights one above the other."""
    return params.xp.concat(
        [params.attn_wq[layer, ...], params.attn_wk[layer, ...], params.attn_wv[layer, ...]], axis=0
    )


def _forward_cached(
    params: Params, tokens: Array, positions: Array | None = None
) -> tuple[Array, list[Any]]:
    """The last hidden state ``(B, T, C)`` of valid ``tokens (B, T)`` and the caches; packed
    rows: ``positions (B, T)``, each token's position in its document."""
    cfg = params.config
    c = cfg.n_embd
    packed = {} if positions is None else {"doc_positions": positions}
    e, c_emb = L.embedding_forward(tokens, params.wte, params.wpe, positions)
    x, c_norm0 = L.rmsnorm_forward(e, c)
    caches: list[Any] = [c_emb, c_norm0]
    for layer in range(cfg.n_layer):
        h, c1 = L.rmsnorm_forward(x, c)
        qkv, c2 = L.linear_forward(h, qkv_weight(params, layer))
        a, c3 = P.causal_attention(qkv, cfg.n_head, cfg.head_dim, **packed)
        o, c4 = L.linear_forward(a, params.attn_wo[layer, ...])
        x = x + o
        h, c5 = L.rmsnorm_forward(x, c)
        u, c6 = L.linear_forward(h, params.mlp_fc1[layer, ...])
        u, c7 = P.relu(u)
        m, c8 = L.linear_forward(u, params.mlp_fc2[layer, ...])
        x = x + m
        caches.append((c1, c2, c3, c4, c5, c6, c7, c8))
    return x, caches


def _backward(params: Params, dx: Array, caches: list[Any]) -> dict[str, Array]:
    """Gradients of every weight but ``lm_head`` from ``dx (B, T, C)``, the last hidden state's."""
    cfg = params.config
    c = cfg.n_embd
    per_layer: dict[str, list[Array]] = {name: [] for name in LAYER_FIELDS}
    for layer in reversed(range(cfg.n_layer)):
        c1, c2, c3, c4, c5, c6, c7, c8 = caches[2 + layer]
        du, dfc2 = L.linear_backward(dx, c8)
        dh, dfc1 = L.linear_backward(P.relu_backward(du, c7), c6)
        dx = dx + L.rmsnorm_backward(dh, c5)
        da, dwo = L.linear_backward(dx, c4)
        dh, dwqkv = L.linear_backward(P.causal_attention_backward(da, c3), c2)
        dx = dx + L.rmsnorm_backward(dh, c1)
        grads = (dwqkv[:c, :], dwqkv[c : 2 * c, :], dwqkv[2 * c :, :], dwo, dfc1, dfc2)
        for name, g in zip(LAYER_FIELDS, grads, strict=True):
            per_layer[name].insert(0, g)
    dwte, dwpe = L.embedding_backward(L.rmsnorm_backward(dx, caches[1]), caches[0])
    return {"wte": dwte, "wpe": dwpe, **{n: _stack_layers(gs) for n, gs in per_layer.items()}}


def _stack_layers(per_layer: list[Array]) -> Array:
    """The layers' gradients ``(n_layer, ...)``; one layer: a view, not a copy (and no
    shape read: a symbolic one may be unknown)."""
    if len(per_layer) == 1:
        return per_layer[0][None, ...]
    return _xp.array_namespace(per_layer[0]).stack(per_layer, axis=0)


def _row_weights(n: Array, valid: Array, reduction: str) -> tuple[Array, Array]:
    """The loss's weight of each position ``(B, T)`` and the per-row (``"mean"``: ``1/n``)
    or total (``"token_mean"``) factor. ``1/B`` from the data where ``B`` is unknown."""
    xp = _xp.array_namespace(valid)
    if reduction == "mean":
        inv_n = 1.0 / xp.astype(n, valid.dtype)
        rows = valid.shape[0]
        inv_b = 1.0 / rows if isinstance(rows, int) else 1.0 / xp.sum(xp.ones_like(inv_n))
        return valid * (inv_n * inv_b)[:, None], inv_n
    inv_total = 1.0 / xp.sum(valid)
    return valid * inv_total, inv_total


def _safe_tokens(tokens: Array, lengths: Array) -> Array:
    """Padding replaced by id 0, so that it never reaches the model."""
    xp = _xp.array_namespace(tokens)
    real = P.positions(tokens)[None, :] < lengths[:, None]
    return xp.where(real, tokens, xp.zeros_like(tokens))


def forward(params: Params, tokens: Array, lengths: Array | None = None) -> Array:
    """Logits ``(B, T, V)`` in the params' dtype of ``tokens (B, T)`` (integer ids of the
    params' namespace and device, ``T <= block_size``, rows right-padded) with ``lengths
    (B,)`` real tokens per row (default: all ``T``). Position ``t`` sees tokens ``0..t`` of
    its row only; logits at padded positions are meaningless.

    Raises ``TypeError``/``ValueError`` for tokens of another namespace or device, a
    non-integer dtype, ids outside ``[0, V)``, ``T > block_size`` or bad ``lengths``.
    """
    tokens, lengths = check_tokens(
        params, tokens, lengths, max_len=params.config.block_size, min_length=1
    )
    if lengths is not None:
        tokens = _safe_tokens(tokens, lengths)
    x, _ = _forward_cached(params, tokens)
    return P.linear(x, params.lm_head)


def _nll(
    params: Params, tokens: Array, lengths: Array, positions: Array | None = None
) -> tuple[Array, ...]:
    """Of documents ``(B, L)`` (or packed rows, ``positions (B, L - 1)``): losses ``(B, T)``
    (0 at padding), ``n = min(lengths - 1, block_size)``, the ``(B, T)`` mask of predicted
    positions and the caches."""
    xp = params.xp
    safe = _safe_tokens(tokens, lengths)
    inputs, targets = safe[:, :-1], safe[:, 1:]
    n = xp.minimum(lengths - 1, xp.full_like(lengths, params.config.block_size))
    valid = xp.astype(P.positions(inputs)[None, :] < n[:, None], params.dtype)
    x, caches = _forward_cached(params, inputs, positions)
    losses, c_head = P.head_cross_entropy(x, params.lm_head, targets, valid)
    return losses, n, valid, caches, c_head


def loss_and_grads(
    params: Params,
    tokens: Array,
    lengths: Array,
    *,
    reduction: Reduction = "mean",
    check: bool = True,
    positions: Array | None = None,
    weights: Array | None = None,
) -> tuple[Array, Params]:
    """The training loss of a batch of documents and its gradient (hand-written backward).

    Args:
        params: the weights.
        tokens: ``(B, L)`` integer ids, ``L <= block_size + 1``, each row ``BOS, chars…,
            BOS`` as the spec encodes a document, right-padded.
        lengths: ``(B,)`` real tokens per row, each ``>= 2``.
        reduction: ``"mean"``: the mean over rows of each row's mean ``−log p(next token)``
            over its ``n_b = min(lengths[b] − 1, block_size)`` predictions (microgpt's loss
            when ``B = 1``); ``"token_mean"``: the mean over all predicted tokens.
        check: check the batch first (below); ``False`` is for a driver whose batches
            were checked once where it made them (``train`` from its encoded corpus).
        positions, weights: a packed batch (:func:`~microgpt_xp.data.pack_batch`): rows of
            several documents sharing their BOS, ``positions (B, L − 1)`` each
            input's position in its document (it sees its document's earlier tokens only)
            and ``weights (B, L − 1)`` in the params' dtype each prediction's weight: the
            loss is ``Σ weights · losses`` (``reduction`` unused). ``weights`` alone weighs
            an unpacked batch so.

    Returns:
        ``(loss, grads)``: a 0-d array and a :class:`Params` of the params' namespace,
        device and dtype; rows of ``wte``/``wpe`` the batch does not use get exactly 0.

    Raises ``TypeError``/``ValueError`` as :func:`forward` does, and for ``positions``
    without ``weights`` or either of another shape than the inputs (on lazy arrays the
    value checks run when the result is computed).
    """
    check_reduction(reduction)
    cfg = params.config
    if positions is not None and weights is None:
        raise ArgumentValueError("weights", "positions= (a packed batch) needs weights=")
    if check:
        tokens, lengths = check_tokens(
            params, tokens, lengths, max_len=cfg.block_size + 1, min_length=2
        )
        if weights is not None:
            _check_packed(params, tokens, positions, weights)
    xp = params.xp
    losses, n, valid, caches, c_head = _nll(params, tokens, lengths, positions)
    if weights is None:
        dlosses, inv = _row_weights(n, valid, reduction)
        if reduction == "mean":
            loss = xp.mean(xp.sum(losses, axis=1) * inv)
        else:
            loss = xp.sum(losses) * inv
    else:
        dlosses = weights * valid
        loss = xp.sum(losses * dlosses)
    dx, dlm_head = P.head_cross_entropy_backward(dlosses, c_head)
    grads = _backward(params, dx, caches)
    return loss, Params.trusted(cfg, {**grads, "lm_head": dlm_head})


def _check_packed(params: Params, tokens: Array, positions: Array | None, weights: Array) -> None:
    """``ArgumentValueError`` unless ``weights`` (and ``positions``) are ``(B, L - 1)`` arrays
    of the params' namespace, ``weights`` of their dtype, ``positions`` integers with
    ``0 <= positions[b, i] <= min(i, block_size - 1)`` (read where values are at hand)."""
    xp = params.xp
    inputs = tokens[:, :-1]
    for name, x in (("weights", weights), ("positions", positions)):
        if x is None:
            continue
        if _xp.array_namespace(x) is not xp or getattr(x, "ndim", None) != 2:
            raise ArgumentValueError(name, f"{name} must be a 2-d array of the params' namespace")
        shapes = (tuple(x.shape), tuple(inputs.shape))
        if all(isinstance(d, int) for d in (*shapes[0], *shapes[1])) and shapes[0] != shapes[1]:
            raise ArgumentValueError(
                name, f"{name} must have the inputs' shape {shapes[1]}, got {shapes[0]}"
            )
    if weights.dtype != params.dtype:
        raise ArgumentValueError("weights", f"weights must be {params.dtype}, got {weights.dtype}")
    if positions is None:
        return
    if not _xp.is_integral(xp, positions.dtype):
        raise ArgumentValueError("positions", "positions must have an integer dtype")
    if _xp.is_lazy(positions) or not isinstance(positions.shape[1], int):
        return
    ids = P.positions(inputs)[None, :]
    bad = (positions < 0) | (positions > ids) | (positions >= params.config.block_size)
    if _xp.read_scalar(xp.any(bad), bool):
        raise ArgumentValueError(
            "positions",
            "positions must lie in [0, block_size) and count up from 0 at each document's start",
        )


def train_step(
    params: Params,
    state: AdamState,
    tokens: Array,
    lengths: Array,
    *,
    reduction: Reduction = "mean",
    optimizer: AdamConfig | None = None,
    check: bool = True,
    positions: Array | None = None,
    weights: Array | None = None,
    **changes: Any,
) -> tuple[Params, AdamState, Array]:
    """One pure training step: :func:`loss_and_grads` of the batch (same arguments, a packed
    batch's ``positions``/``weights`` included), then one :func:`~microgpt_xp.adam_update`
    with ``optimizer`` (the spec's :class:`~microgpt_xp.AdamConfig` by default; ``changes``
    replace some of its fields). ``check`` as for :func:`loss_and_grads`.
    Returns ``(new_params, new_state, loss)``, the loss before the update. Nothing is
    modified, so ``jax.jit(train_step)`` compiles it as it is (once per batch shape)."""
    hp = adam_config(optimizer, **changes)
    loss, grads = loss_and_grads(
        params,
        tokens,
        lengths,
        reduction=reduction,
        check=check,
        positions=positions,
        weights=weights,
    )
    new_params, new_state = adam_update(params, grads, state, hp)
    return new_params, new_state, loss


def score(
    params: Params, tokens: Array, lengths: Array, *, jit: bool | None = None, check: bool = True
) -> Array:
    """``(B,)`` each document's mean negative log-likelihood per predicted token (the spec's
    loss of that document) in the params' dtype, for ``tokens``/``lengths`` as
    :func:`loss_and_grads` takes them; lazy on Dask. ``jit=None`` compiles where the
    namespace has a compiler (JAX, once per batch shape), ``False`` never, ``True`` insists
    (``ValueError`` elsewhere). The inputs are checked before anything is compiled
    (``check=False``: by the caller, as for :func:`loss_and_grads`)."""
    cfg = params.config
    compile_fn = _xp.compiler(params.backend, jit)
    if check:
        tokens, lengths = check_tokens(
            params, tokens, lengths, max_len=cfg.block_size + 1, min_length=2
        )
    if compile_fn is not None and not _xp.is_traced(tokens):
        return _xp.compiled(score, params.backend)(params, tokens, lengths)
    xp = params.xp
    losses, n, *_ = _nll(params, tokens, lengths)
    return xp.sum(losses, axis=1) * (1.0 / xp.astype(n, losses.dtype))


@dataclass(frozen=True)
class KVCache:
    """Keys and values of the positions decoded so far: ``keys[l]``, ``values[l]`` layer
    ``l``'s ``(block_size, C, B)`` buffers, ``pos`` the positions decoded. A 0-d array
    ``pos`` (:meth:`zeros`): slots written by ``where`` (a compiled step compiles once per
    batch size); an int: in place where allowed. A JAX pytree. ``KVCache()``: allocated by
    the first :func:`decode_step`."""

    keys: tuple[Array, ...] = ()
    values: tuple[Array, ...] = ()
    pos: Any = 0

    @classmethod
    def empty(cls) -> KVCache:
        """A fresh cache, allocated by the first :func:`decode_step` (position 0)."""
        return cls()

    @classmethod
    def zeros(cls, params: Params, batch_size: int) -> KVCache:
        """A fresh cache for ``batch_size`` sequences on the params' namespace and device:
        ``n_layer`` pairs of ``(block_size, C, batch_size)`` zero buffers, ``pos`` a 0-d 0."""
        cfg = params.config
        shape = (cfg.block_size, cfg.n_embd, batch_size)
        bufs = tuple(P.full(shape, 0.0, params.wte) for _ in range(2 * cfg.n_layer))
        pos = P.full((), 0, params.wte, dtype=params.xp.int64)
        return cls(bufs[: cfg.n_layer], bufs[cfg.n_layer :], pos)


_pytree.register(KVCache, lambda c: ((c.keys, c.values, c.pos), None), lambda _, ch: KVCache(*ch))


def decode_step(params: Params, token_ids: Array, cache: KVCache) -> tuple[Array, KVCache]:
    """One position of the model for a batch: ``token_ids (B,)`` at position ``cache.pos``
    (same namespace and device), the :class:`KVCache` of the earlier positions
    (``KVCache()`` to start) -> ``(logits (B, V), new_cache)``, the logits :func:`forward`
    gives at that position (the new key and value are written before attending).

    Raises ``TypeError``/``ValueError`` for a bad cache, ids of another shape, namespace or
    device, ids outside ``[0, V)`` and a full cache (a traced ``pos`` is not read).
    """
    cfg = params.config
    if not isinstance(cache, KVCache):
        raise ArgumentTypeError("cache", f"cache must be a KVCache, got {type(cache).__name__}")
    if getattr(token_ids, "ndim", None) != 1:
        raise ArgumentValueError(
            "token_ids",
            f"token_ids must be 1-d (batch,), got {getattr(token_ids, 'shape', token_ids)}",
        )
    if not cache.keys:
        cache = KVCache.zeros(params, token_ids.shape[0])
    rows, slots = token_ids.shape[0], cache.keys[0].shape[2]
    if isinstance(rows, int) and isinstance(slots, int) and rows != slots:
        raise ArgumentValueError("token_ids", f"token_ids hold {rows} rows but the cache {slots}")
    pos = cache.pos if isinstance(cache.pos, int) else _xp.read_int(cache.pos)
    if pos is not None and pos >= cfg.block_size:
        raise ArgumentValueError(
            "cache", f"the cache is full: position {pos} is past block_size {cfg.block_size}"
        )
    checked, _ = check_tokens(
        params, token_ids[:, None], None, max_len=cfg.block_size, min_length=1
    )
    x_t, new_cache = decode_hidden(params, checked[:, 0], cache)
    return params.xp.matrix_transpose(P.matmul(params.lm_head, x_t)), new_cache


def decode_hidden(params: Params, token_ids: Array, cache: KVCache) -> tuple[Array, KVCache]:
    """:func:`decode_step` up to the last hidden state, unchecked (sampled ids, an allocated
    cache): ``(x_t (C, B), new_cache)``, one column per sequence (``lm_head @ x_t`` is the
    logits ``(V, B)``); linear layers are ``w @ x_t``, reductions over leading axes."""
    cfg = params.config
    xp = params.xp
    c = cfg.n_embd
    pos = cache.pos
    if isinstance(pos, int):
        wpe = params.wpe[pos : pos + 1, :]
    else:
        wpe = xp.take(params.wpe, xp.reshape(pos, (1,)), axis=0)
    x = P.embed_columns(token_ids, params.wte) + xp.matrix_transpose(wpe)
    x = L.rmsnorm_columns(x, c)
    keys, values = [], []
    for layer in range(cfg.n_layer):
        qkv = P.matmul(qkv_weight(params, layer), L.rmsnorm_columns(x, c))
        k, v, seen = P.cache_write(
            cache.keys[layer], cache.values[layer], qkv[c : 2 * c, :], qkv[2 * c :, :], pos
        )
        keys.append(k)
        values.append(v)
        y = L.decode_attention(qkv[:c, :], k, v, seen, n_head=cfg.n_head, head_dim=cfg.head_dim)
        x = x + P.matmul(params.attn_wo[layer, ...], y)
        h, _ = P.relu(P.matmul(params.mlp_fc1[layer, ...], L.rmsnorm_columns(x, c)))
        x = x + P.matmul(params.mlp_fc2[layer, ...], h)
    return x, KVCache(tuple(keys), tuple(values), pos + 1)
