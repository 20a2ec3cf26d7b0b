"""The model as a standalone ONNX file: the model's own code run on ndonnx's lazy arrays
(no second implementation, no hand-written nodes), its constants stored as initializers.

Two graphs (``B`` batch and ``T`` time dynamic; ``L`` n_layer, ``S`` block_size, ``C``
n_embd, ``V`` vocab_size; ``float`` the params' dtype):

- ``"forward"`` (:func:`~microgpt_xp.forward`): ``tokens`` int64 ``(B, T)`` and ``lengths``
  int64 ``(B,)`` (``1 <= T <= S``, ``1 <= lengths <= T``, ids in ``[0, V)``) -> ``logits``
  float ``(B, T, V)``, meaningful at positions ``< lengths``.
- ``"decode"`` (:func:`~microgpt_xp.decode_step`): ``token_ids`` int64 ``(B,)``, ``keys_l``
  and ``values_l`` float ``(S, C, B)`` for each layer ``l`` (``KVCache.keys[l]``; zeros at
  first) and ``pos`` int64 ``()`` (from 0, at most ``S - 1``) -> ``logits`` float ``(B,
  V)``, ``new_keys_l``, ``new_values_l`` and ``new_pos`` (``pos + 1``), each ``new_X`` the
  next step's ``X``. One buffer per layer: stacking would copy each twice a step.

The graphs do not validate their inputs: out-of-range positions or ids fail in an
indexing node or give meaningless logits.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import _xp
from ._backends import install_extra
from ._errors import ArgumentTypeError, ArgumentValueError
from ._files import atomic_write
from ._version import __version__
from .data import Tokenizer
from .model import KVCache, decode_step, forward
from .params import Params

#: protobuf cannot serialize a message of 2 GiB or more (ONNX's single-file limit).
_MAX_BYTES = 2**31 - 1


def export_onnx(
    params: Params,
    path: str | Path,
    *,
    graph: str = "forward",
    tokenizer: Tokenizer | None = None,
) -> Path:
    """Write the model as a standalone ONNX file (weights inside) and return its path.

    Args:
        params: the weights, float32 or float64 (the graph's dtype), on any backend.
        path: the file to write (replaced atomically; missing folders are made).
        graph: ``"forward"`` or ``"decode"`` (see :mod:`microgpt_xp.export`).
        tokenizer: stored, if given, in ``metadata_props`` as ``microgpt_xp.tokenizer``
            (``{"chars": ...}`` in JSON, BOS ``len(chars)``) beside ``microgpt_xp.graph``,
            ``microgpt_xp.config`` and ``microgpt_xp.version`` (onnxruntime:
            ``get_modelmeta().custom_metadata_map``).

    ``TypeError`` for params or a tokenizer of another type, ``ValueError`` for an unknown
    graph, a tokenizer of another vocabulary size or a model of 2 GiB or more (protobuf's
    limit), ``ImportError`` (saying what to install) without ndonnx or onnx.
    """
    model = onnx_model(params, graph=graph, tokenizer=tokenizer)
    if model.ByteSize() > _MAX_BYTES:
        raise ValueError(
            f"the ONNX model takes {model.ByteSize()} bytes, past protobuf's 2 GiB limit"
        )
    return atomic_write(path, model.SerializeToString())


def onnx_model(
    params: Params, *, graph: str = "forward", tokenizer: Tokenizer | None = None
) -> Any:
    """The ``onnx.ModelProto`` that :func:`export_onnx` writes."""
    if not isinstance(params, Params):
        raise ArgumentTypeError("params", f"params must be a Params, got {type(params).__name__}")
    if graph not in _GRAPHS:
        raise ArgumentValueError(
            "graph", f"unknown graph {graph!r}; choose one of {', '.join(_GRAPHS)}"
        )
    props = {
        "microgpt_xp.graph": graph,
        "microgpt_xp.config": json.dumps(params.config.to_dict()),
        "microgpt_xp.version": __version__,
    }
    if tokenizer is not None:
        if not isinstance(tokenizer, Tokenizer):
            raise ArgumentTypeError(
                "tokenizer", f"tokenizer must be a Tokenizer, got {type(tokenizer).__name__}"
            )
        if tokenizer.vocab_size != params.config.vocab_size:
            raise ArgumentValueError(
                "tokenizer",
                f"tokenizer has {tokenizer.vocab_size} ids but the model {params.config.vocab_size}",
            )
        props["microgpt_xp.tokenizer"] = json.dumps(tokenizer.to_dict())
    try:
        import ndonnx as ndx
        import onnx
    except ImportError as exc:
        raise ImportError(f"ONNX export needs ndonnx and onnx: {install_extra('onnx')}") from exc
    host = {  # ndonnx's own arrays through unwrap_numpy, which refuses lazy ones
        k: a.unwrap_numpy() if isinstance(a, ndx.Array) else _xp.to_numpy(a)
        for k, a in params.arrays().items()
    }
    on_ndonnx = Params.trusted(params.config, {k: ndx.asarray(a) for k, a in host.items()})
    inputs, outputs, shapes = _GRAPHS[graph](on_ndonnx, ndx)
    model = ndx.build(inputs, outputs)
    _constants_to_initializers(model.graph, onnx)
    for value in model.graph.output:  # ndonnx leaves the dynamic dimensions unknown
        dims = value.type.tensor_type.shape.dim
        del dims[:]
        for size in shapes[value.name]:
            if isinstance(size, str):
                dims.add().dim_param = size
            else:
                dims.add().dim_value = size
    ndonnx_props = {p.key: p.value for p in model.metadata_props}  # ndonnx's schema
    onnx.helper.set_model_props(model, {**ndonnx_props, **props})
    onnx.checker.check_model(model, full_check=True)  # also checks the shapes declared
    return model


#: ``(inputs, outputs, shapes)``: named ndonnx arguments and results, and the documented
#: shape of each output (ints, or names of dynamic dimensions).
Graph = tuple[dict[str, Any], dict[str, Any], dict[str, tuple[int | str, ...]]]


def _forward_graph(params: Params, ndx: Any) -> Graph:
    tokens = ndx.argument(shape=("batch", "time"), dtype=ndx.int64)
    lengths = ndx.argument(shape=("batch",), dtype=ndx.int64)
    logits = forward(params, tokens, lengths)
    shape = ("batch", "time", params.config.vocab_size)
    return {"tokens": tokens, "lengths": lengths}, {"logits": logits}, {"logits": shape}


def _decode_graph(params: Params, ndx: Any) -> Graph:
    cfg = params.config
    shape = (cfg.block_size, cfg.n_embd, "batch")
    layers = range(cfg.n_layer)
    token_ids = ndx.argument(shape=("batch",), dtype=ndx.int64)
    keys, values = (
        {f"{kind}_{i}": ndx.argument(shape=shape, dtype=params.dtype) for i in layers}
        for kind in ("keys", "values")
    )
    pos = ndx.argument(shape=(), dtype=ndx.int64)
    cache = KVCache(keys=tuple(keys.values()), values=tuple(values.values()), pos=pos)
    logits, new = decode_step(params, token_ids, cache)
    outputs = {
        "logits": logits,
        **{f"new_keys_{i}": new.keys[i] for i in layers},
        **{f"new_values_{i}": new.values[i] for i in layers},
        "new_pos": new.pos,
    }
    shapes: dict[str, tuple[int | str, ...]] = {name: shape for name in outputs}
    shapes.update({"logits": ("batch", cfg.vocab_size), "new_pos": ()})
    return {"token_ids": token_ids, **keys, **values, "pos": pos}, outputs, shapes


_GRAPHS: dict[str, Callable[[Params, Any], Graph]] = {
    "forward": _forward_graph,
    "decode": _decode_graph,
}


def _constants_to_initializers(graph: Any, onnx: Any) -> None:
    """Move the tensors of the top-level ``Constant`` nodes (the weights among them) into
    ``graph.initializer``, where ONNX tools look for weights."""
    outputs = {o.name for o in graph.output}
    kept = []
    for node in graph.node:
        attrs = {a.name: a for a in node.attribute}
        if node.op_type == "Constant" and set(attrs) == {"value"} and node.output[0] not in outputs:
            tensor = onnx.TensorProto()
            tensor.CopyFrom(attrs["value"].t)
            tensor.name = node.output[0]
            graph.initializer.append(tensor)
        else:
            kept.append(node)
    del graph.node[:]
    graph.node.extend(kept)
