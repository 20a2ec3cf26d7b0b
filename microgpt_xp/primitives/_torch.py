"""PyTorch's overrides: fused kernels where the generic code launches several (measured in
docs/performance.md)."""

from __future__ import annotations

import functools
from typing import Any

import torch


def scatter_add_rows(ids: Any, values: Any, num_rows: int) -> Any:
    """torch's ``index_add`` (a one-hot product could be rounded to TF32 on CUDA)."""
    out = torch.zeros((num_rows, values.shape[-1]), dtype=values.dtype, device=values.device)
    return out.index_add(0, ids, values)


def relu(x: Any) -> tuple[Any, Any]:
    """``torch.relu``, the output as cache (the generic mask costs ten times as much)."""
    y = torch.relu(x)
    return y, y


def relu_backward(dy: Any, y: Any) -> Any:
    """``threshold_backward`` of the output: autograd's one kernel."""
    return torch.ops.aten.threshold_backward(dy, y, 0)


def causal_attention(
    qkv: Any, n_head: int, head_dim: int, doc_positions: Any = None
) -> tuple[Any, Any]:
    """The generic math with fused kernels; ``q, k, v`` made head-major by one copy (a batched
    product copies a strided operand at every read); packed rows' ``doc_positions (B, T)``
    give a ``(B, 1, T, T)`` mask (:func:`_document_mask`)."""
    b, t, _ = qkv.shape
    h, d = n_head, head_dim
    c = h * d
    scale = float(d) ** -0.5
    heads = qkv.reshape(b, t, 3, h, d).permute(2, 0, 3, 1, 4).contiguous()  # (3, B, H, T, D)
    q, k, v = heads.unbind(0)
    qs = q * scale
    scores = torch.matmul(qs, k.transpose(-1, -2))
    if doc_positions is None:
        scores.add_(_causal_mask(t, qkv.dtype, qkv.device))
    else:
        scores.add_(_document_mask(doc_positions, qkv.dtype))
    att = torch.softmax(scores, dim=-1)
    y = torch.matmul(att, v)
    return y.transpose(1, 2).reshape(b, t, c), (qs, k, v, att, scale)


def causal_attention_backward(dy: Any, cache: Any) -> Any:
    """Autograd's softmax backward kernel (private: tests/test_primitives.py pins it); the
    gradients go into one head-major buffer, relaid into ``dqkv`` by one copy."""
    qs, k, v, att, scale = cache
    b, h, t, d = qs.shape
    dy_heads = dy.reshape(b, t, h, d).transpose(1, 2).contiguous()
    datt = torch.matmul(dy_heads, v.transpose(-1, -2))
    dscores = torch._softmax_backward_data(datt, att, -1, att.dtype)
    grads = torch.empty((3, b, h, t, d), dtype=dy.dtype, device=dy.device)
    torch.matmul(dscores, k, out=grads[0])
    grads[0].mul_(scale)
    torch.matmul(dscores.transpose(-1, -2), qs, out=grads[1])
    torch.matmul(att.transpose(-1, -2), dy_heads, out=grads[2])
    return grads.permute(1, 3, 0, 2, 4).reshape(b, t, 3 * h * d)


@functools.lru_cache(maxsize=8)
def _causal_mask(t: int, dtype: Any, dev: Any) -> Any:
    """The ``(T, T)`` causal mask, cached (never written to)."""
    return torch.full((t, t), float("-inf"), dtype=dtype, device=dev).triu(1)


def _document_mask(doc_positions: Any, dtype: Any) -> Any:
    """``(B, 1, Tq, Tk)``: 0 where query ``q`` of row ``b`` sees key ``k`` (``q -
    doc_positions[b, q] <= k <= q``), else ``-inf``."""
    ids = torch.arange(doc_positions.shape[1], device=doc_positions.device)
    first = ids[None, :] - doc_positions  # (B, Tq)
    visible = (ids[None, None, :] <= ids[None, :, None]) & (ids[None, None, :] >= first[..., None])
    mask = torch.zeros(visible.shape, dtype=dtype, device=doc_positions.device)
    return mask.masked_fill_(~visible, float("-inf"))[:, None]


def cross_entropy(logits: Any, targets: Any, valid: Any) -> tuple[Any, Any]:
    """``-log_softmax(z)[target]`` by one kernel each; the cache ``(logp, targets (…, 1))``."""
    index = targets[..., None].long()  # no copy for int64 ids
    logp = torch.log_softmax(logits, dim=-1)
    losses = logp.gather(-1, index)[..., 0].neg_()
    if valid is not None:
        losses = torch.where(valid != 0, losses, 0.0)
    return losses, (logp, index)


def cross_entropy_backward(dlosses: Any, cache: Any) -> Any:
    """``exp(logp) * dlosses``, ``dlosses`` subtracted at the targets (``scatter_add_``)."""
    logp, index = cache
    weight = dlosses[..., None]
    return torch.exp(logp).mul_(weight).scatter_add_(-1, index, -weight)
