"""ndonnx's overrides of :mod:`microgpt_xp.primitives`: the forms that export as fewer or
cheaper ONNX nodes than the generic code (measured: benchmarks/onnx_graphs.py)."""

from __future__ import annotations

from typing import Any

import ndonnx as ndx

from . import _generic

# -- the forward and training graphs ------------------------------------------------------

# -- decoding (the decode and generate graphs) --------------------------------------------


def embed_columns(ids: Any, table: Any) -> Any:
    """Rows taken then transposed: one ``Gather`` of rows, where onnxruntime gathers along the
    last axis element by element (measured: a fifth of the generate graph's time)."""
    return ndx.matrix_transpose(ndx.take(table, ids, axis=0))


def cache_write(keys: Any, values: Any, k: Any, v: Any, pos: Any) -> tuple[Any, ...]:
    """Buffers of an unknown number of slots (the generate graph's ``Loop`` carries them so)
    hold exactly the ``pos`` slots written: the new one is appended (one ``Concat``), and
    ``seen`` is ``None``, every slot (no mask, no attention to unwritten slots; measured:
    the generate graph 2x faster than by ``where``). Buffers of a known size (the decode
    graph, eager arrays): the generic ``where``."""
    if keys.shape[0] is not None:
        return _generic.cache_write.__wrapped__(keys, values, k, v, pos)  # type: ignore[attr-defined,no-any-return]
    grown = (ndx.concat([old, new[None, ...]], axis=0) for old, new in ((keys, k), (values, v)))
    return (*grown, None)


def slot_heads(x: Any, n_head: int, head_dim: int) -> Any:
    """The reshape, with the sizes read at run time where the slots are unknown."""
    if x.shape[0] is not None:
        return _generic.slot_heads.__wrapped__(x, n_head, head_dim)  # type: ignore[attr-defined]
    sizes = x.dynamic_shape
    heads = ndx.asarray([n_head, head_dim], dtype=ndx.int64)
    return ndx.reshape(x, ndx.concat([sizes[:1], heads, sizes[2:]], axis=0))
