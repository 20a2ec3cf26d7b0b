"""The GPT: whole-sequence ``forward``, token-by-token ``decode_step`` with a ``KVCache``,
``loss_and_grads`` (the hand-written backward pass) and per-document ``score``.

All of it is composed from the forward/backward pairs in :mod:`microgpt_xp.layers` and
the operations of :mod:`microgpt_xp.primitives`, and runs on whatever namespace and device
the inputs live on. Nothing takes a Python int from the batch or the time of its inputs
(symbolic arrays leave them unknown): only the config's sizes are Python ints.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from . import _pytree, _xp
from . import layers as L
from . import primitives as P
from ._checks import check_tokens as _check_tokens
from ._xp import array_namespace
from .optim import AdamConfig, AdamState, adam_config, adam_update
from .params import LAYER_FIELDS, Params

Array = Any
Reduction = Literal["mean", "token_mean"]


def _real_mask(lengths: Array, pos: Array, dtype: Any) -> Array:
    """``(B, T)`` 1 at positions ``pos (T,)`` below ``lengths[b]``, else 0, in ``dtype``."""
    xp = array_namespace(lengths)
    return xp.astype(pos[None, :] < lengths[:, None], dtype)


# -- forward and backward over whole sequences ---------------------------------------------
def qkv_weight(params: Params, layer: int) -> Array:
    """``(3C, C)``: layer ``layer``'s query, key and value weights one above the other."""
    xp = params.xp
    return xp.concat(
        [params.attn_wq[layer, ...], params.attn_wk[layer, ...], params.attn_wv[layer, ...]], axis=0
    )


def _forward_cached(params: Params, tokens: Array) -> tuple[Array, list[Any]]:
    """The last hidden state ``(B, T, C)`` of valid ``tokens (B, T)`` (the input of
    ``lm_head``) and the caches of the blocks for :func:`_backward`."""
    cfg = params.config
    c = cfg.n_embd
    e, c_emb = L.embedding_forward(tokens, params.wte, params.wpe)
    x, c_norm0 = L.rmsnorm_forward(e, c)
    caches: list[Any] = [c_emb, c_norm0]
    for layer in range(cfg.n_layer):
        h, c1 = L.rmsnorm_forward(x, c)
        qkv, c2 = L.linear_forward(h, qkv_weight(params, layer))
        a, c3 = P.causal_attention(qkv, cfg.n_head, cfg.head_dim)
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
    """Gradients of every weight but ``lm_head`` from ``dx (B, T, C)``, the gradient of the
    last hidden state, walking the caches in reverse."""
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
    dwte, dwpe = L.embedding_backward(de, caches[0])
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
    real = P.positions(tokens)[None, :] < lengths[:, None]
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
        on the padding (the logits at padded positions are meaningless). ``B`` and ``T``
        may be unknown (symbolic arrays): nothing here needs them as Python ints.

    Raises ``TypeError``/``ValueError`` for tokens of another namespace or device, a
    non-integer dtype, ids outside ``[0, V)``, ``T > block_size`` or bad ``lengths``
    (what is checked where values cannot be read: see :mod:`microgpt_xp._checks`).
    """
    cfg = params.config
    tokens, lengths = _check_tokens(params, tokens, lengths, max_len=cfg.block_size, min_length=1)
    if lengths is not None:
        tokens = _safe_tokens(tokens, lengths)
    x, _ = _forward_cached(params, tokens)
    return P.linear(x, params.lm_head)


def _prediction_inputs(
    params: Params, tokens: Array, lengths: Array
) -> tuple[Array, Array, Array, Array]:
    """Split checked documents ``(B, L)`` (``L <= block_size + 1``) into model inputs,
    targets and the per-row number of predictions ``n = min(lengths - 1, block_size)``;
    returns ``(inputs, targets, n, valid)``."""
    xp = params.xp
    safe = _safe_tokens(tokens, lengths)
    inputs, targets = safe[:, :-1], safe[:, 1:]
    n = xp.minimum(lengths - 1, xp.full_like(lengths, params.config.block_size))
    valid = _real_mask(n, P.positions(inputs), params.dtype)
    return inputs, targets, n, valid


def _nll(
    params: Params, tokens: Array, lengths: Array
) -> tuple[Array, Array, Array, list[Any], Any]:
    """Per-position losses ``(B, T)`` (zero at padding, whatever the model predicts
    there), ``n (B,)``, ``valid (B, T)``, the caches of the forward pass and of the
    output layer with the loss."""
    inputs, targets, n, valid = _prediction_inputs(params, tokens, lengths)
    x, caches = _forward_cached(params, inputs)
    losses, c_head = P.head_cross_entropy(x, params.lm_head, targets, valid)
    return losses, n, valid, caches, c_head


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

    Returns:
        ``(loss, grads)``: ``loss`` a 0-d array of the params' namespace, ``grads`` a
        :class:`Params` of the same namespace, device and dtype. Rows of ``wte``/``wpe``
        the batch does not use get exactly zero gradient.

    Raises ``TypeError``/``ValueError`` for tokens or lengths of another namespace or
    device, non-integer dtypes, ids outside ``[0, V)`` at real positions, or lengths that
    do not fit (checked here, once, before any model code; on lazy arrays the value
    checks run when the result is computed).
    """
    _check_reduction(reduction)
    cfg = params.config
    tokens, lengths = _check_tokens(
        params, tokens, lengths, max_len=cfg.block_size + 1, min_length=2
    )
    return _loss_and_grads(params, tokens, lengths, reduction)


def _check_reduction(reduction: str) -> None:
    if reduction not in ("mean", "token_mean"):
        raise ValueError(f"reduction must be 'mean' or 'token_mean', got {reduction!r}")


def _loss_and_grads(
    params: Params, tokens: Array, lengths: Array, reduction: Reduction
) -> tuple[Array, Params]:
    """:func:`loss_and_grads` of a checked batch: the math alone, no host reads."""
    xp = params.xp
    losses, n, valid, caches, c_head = _nll(params, tokens, lengths)
    weights, factor = _row_weights(n, valid, reduction)
    if reduction == "mean":
        loss = xp.mean(xp.sum(losses, axis=1) * factor)
    else:
        loss = xp.sum(losses) * factor
    dx, dlm_head = P.head_cross_entropy_backward(weights, c_head)
    grads = _backward(params, dx, caches)
    return loss, Params.trusted(params.config, {**grads, "lm_head": dlm_head})


def train_step(
    params: Params,
    state: AdamState,
    tokens: Array,
    lengths: Array,
    *,
    reduction: Reduction = "mean",
    optimizer: AdamConfig | None = None,
    **changes: Any,
) -> tuple[Params, AdamState, Array]:
    """One training step, as a pure function: the batch's loss and gradients
    (:func:`loss_and_grads`), then one Adam update (:func:`~microgpt_xp.adam_update`).

    Args:
        params, state: the weights and the optimizer state (:func:`~microgpt_xp.adam_init`).
        tokens, lengths: the batch, as for :func:`loss_and_grads`.
        reduction: as for :func:`loss_and_grads`.
        optimizer: Adam's :class:`~microgpt_xp.AdamConfig` (the spec's by default);
            ``changes`` replace some of its fields (``num_steps=10``).

    Returns:
        ``(new_params, new_state, loss)``, ``loss`` the batch's loss before the update.

    Nothing is read to the host but the edge checks of eager inputs, and nothing is
    modified, so ``jax.jit(train_step)`` compiles it as it is (once per batch shape).
    """
    _check_reduction(reduction)
    hp = adam_config(optimizer, **changes)
    cfg = params.config
    tokens, lengths = _check_tokens(
        params, tokens, lengths, max_len=cfg.block_size + 1, min_length=2
    )
    return _train_step(params, state, tokens, lengths, reduction=reduction, optimizer=hp)


def _train_step(
    params: Params,
    state: AdamState,
    tokens: Array,
    lengths: Array,
    *,
    reduction: Reduction,
    optimizer: AdamConfig,
) -> tuple[Params, AdamState, Array]:
    """:func:`train_step` of a checked batch: the math alone (what the drivers compile)."""
    loss, grads = _loss_and_grads(params, tokens, lengths, reduction)
    new_params, new_state = adam_update(params, grads, state, optimizer)
    return new_params, new_state, loss


def score(params: Params, tokens: Array, lengths: Array, *, jit: bool | None = None) -> Array:
    """Each document's mean negative log-likelihood per predicted token (the spec's loss
    of that document), with the same ``tokens (B, L)`` / ``lengths (B,)`` conventions and
    checks as :func:`loss_and_grads`. Returns ``(B,)`` in the params' dtype; lazy on Dask.

    ``jit=None`` compiles the computation where the namespace has a compiler (JAX:
    ``jax.jit``, once per batch shape), ``False`` runs it eagerly, ``True`` insists
    (``ValueError`` on a namespace without a compiler). The inputs are checked first,
    outside anything compiled."""
    cfg = params.config
    compile_fn = _xp.compiler(params.backend, jit)
    tokens, lengths = _check_tokens(
        params, tokens, lengths, max_len=cfg.block_size + 1, min_length=2
    )
    if compile_fn is None:
        return _score(params, tokens, lengths)
    return _xp.compiled(_score, params.backend)(params, tokens, lengths)


def _score(params: Params, tokens: Array, lengths: Array) -> Array:
    """:func:`score` of a checked batch."""
    xp = params.xp
    losses, n, _, _, _ = _nll(params, tokens, lengths)
    return xp.sum(losses, axis=1) * (1.0 / xp.astype(n, losses.dtype))


# -- token-by-token decoding ----------------------------------------------------------------
@dataclass(frozen=True)
class KVCache:
    """Keys and values of the positions decoded so far, for a batch, in fixed-size buffers.

    ``keys[l]`` and ``values[l]`` are ``(block_size, C, B)`` arrays of layer ``l``:
    positions first, then channels, with one column per sequence of the batch; the slots
    of positions not decoded yet hold zeros. ``pos`` is a 0-d integer array, the number
    of positions decoded so far (the position of the next token). Every step writes one
    slot (with ``where``, no in-place write and no ``concat``), so the shapes never change
    and a compiled decoding step (``jax.jit``) compiles once per batch size. A JAX pytree
    when JAX is installed.

    ``KVCache()`` (no buffers yet) is a fresh cache that the first :func:`decode_step`
    allocates for its batch; :meth:`zeros` allocates one up front.
    """

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
        ``n_layer`` pairs of ``(block_size, C, batch_size)`` zero buffers, ``pos = 0``."""
        cfg = params.config
        shape = (cfg.block_size, cfg.n_embd, batch_size)
        bufs = tuple(P.full(shape, 0.0, params.wte) for _ in range(2 * cfg.n_layer))
        pos = P.full((), 0, params.wte, dtype=params.xp.int64)
        return cls(bufs[: cfg.n_layer], bufs[cfg.n_layer :], pos)


_pytree.register(
    KVCache,
    lambda c: ((c.keys, c.values, c.pos), None),
    lambda _, children: KVCache(*children),
)


def decode_step(params: Params, token_ids: Array, cache: KVCache) -> tuple[Array, KVCache]:
    """Run one position of the model for a batch, attending over the cache.

    Args:
        params: the weights.
        token_ids: ``(B,)`` integer ids at position ``cache.pos`` (same namespace/device).
        cache: the :class:`KVCache` of the earlier positions (``KVCache()`` to start).

    Returns:
        ``(logits (B, V), new_cache)``. The logits equal :func:`forward`'s at that position.
        This is the spec's token-by-token forward: the new key and value are written
        before attending, so the position attends to itself.

    Raises ``TypeError``/``ValueError`` for a bad cache, ids of another shape, namespace or
    device, ids outside ``[0, V)`` and a full cache (checked on eager arrays; a traced
    ``pos`` under ``jax.jit`` is not read).
    """
    cfg = params.config
    if not isinstance(cache, KVCache):
        raise TypeError(f"cache must be a KVCache, got {type(cache).__name__}")
    if getattr(token_ids, "ndim", None) != 1:
        raise ValueError(
            f"token_ids must be 1-d (batch,), got {getattr(token_ids, 'shape', token_ids)}"
        )
    if not cache.keys:
        cache = KVCache.zeros(params, token_ids.shape[0])
    rows, slots = token_ids.shape[0], cache.keys[0].shape[2]
    if isinstance(rows, int) and isinstance(slots, int) and rows != slots:
        raise ValueError(f"token_ids hold {rows} rows but the cache {slots}")
    # the edge check of a cache whose position can be read (not traced, not symbolic)
    pos = cache.pos if isinstance(cache.pos, int) else _xp.read_int(cache.pos)
    if pos is not None and pos >= cfg.block_size:
        raise ValueError(f"the cache is full: position {pos} is past block_size {cfg.block_size}")
    # on Dask the value check rides along with the returned (lazy) ids
    checked, _ = _check_tokens(
        params, token_ids[:, None], None, max_len=cfg.block_size, min_length=1
    )
    x_t, new_cache = decode_hidden(params, checked[:, 0], cache)
    return params.xp.matrix_transpose(params.lm_head @ x_t), new_cache


def decode_hidden(params: Params, token_ids: Array, cache: KVCache) -> tuple[Array, KVCache]:
    """:func:`decode_step` up to the last hidden state, without the input checks (for ids
    the model itself sampled, and an allocated cache, see :meth:`KVCache.zeros`): returns
    ``(x_t (C, B), new_cache)``, one column per sequence, so that ``lm_head @ x_t`` gives
    the logits laid out ``(V, B)``.

    The whole step runs in this column layout: the linear layers are ``w @ x_t``, the
    norms and the attention's softmax reduce over leading axes (see
    :func:`~microgpt_xp.layers.decode_attention`), and the ``q``, ``k`` and ``v`` of a step
    are contiguous row blocks of one ``(3C, B)`` product. The new key and value are
    written into slot ``pos`` with ``where``; positions after ``pos`` are hidden from the
    attention.
    """
    cfg = params.config
    xp = params.xp
    c = cfg.n_embd
    pos = cache.pos
    slots = P.arange(cfg.block_size, token_ids, dtype=pos.dtype)
    here, visible = slots == pos, slots <= pos
    wte_t = xp.matrix_transpose(params.wte)
    wpe_t = xp.matrix_transpose(xp.take(params.wpe, xp.reshape(pos, (1,)), axis=0))  # (C, 1)
    x = L.rmsnorm_columns(xp.take(wte_t, token_ids, axis=1) + wpe_t, c)
    keys, values = [], []
    for layer in range(cfg.n_layer):
        qkv = qkv_weight(params, layer) @ L.rmsnorm_columns(x, c)
        k = xp.where(here[:, None, None], qkv[None, c : 2 * c, :], cache.keys[layer])
        v = xp.where(here[:, None, None], qkv[None, 2 * c :, :], cache.values[layer])
        keys.append(k)
        values.append(v)
        y = L.decode_attention(
            qkv[:c, :],
            k,
            v,
            visible,
            n_head=cfg.n_head,
            head_dim=cfg.head_dim,
            slots=cfg.block_size,
        )
        x = x + params.attn_wo[layer, ...] @ y
        h = P.relu(params.mlp_fc1[layer, ...] @ L.rmsnorm_columns(x, c))[0]
        x = x + params.mlp_fc2[layer, ...] @ h
    return x, KVCache(tuple(keys), tuple(values), pos + 1)
