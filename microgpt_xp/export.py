"""The model as a standalone ONNX file, built by running the model's own code on ndonnx's
lazy arrays: no second implementation of the model and no hand-written ONNX nodes.

:func:`export_onnx` places the weights on ndonnx (as constants), calls :func:`forward`
or :func:`decode_step` on ndonnx arguments, and lets ``ndonnx.build`` trace the graph.
The constants of the traced graph are then stored as initializers (where ONNX keeps
weights), and the file is written atomically. Any runtime that reads ONNX (onnxruntime
on CPU or GPU, onnxruntime-web in a browser, ...) can then run the model with no Python
and no microgpt_xp.

Two graphs (``B`` batch, dynamic; ``T`` time; ``L`` n_layer; ``S`` block_size; ``C``
n_embd; ``V`` vocab_size; ``float`` the params' dtype):

- ``"forward"`` (:func:`~microgpt_xp.forward`): inputs ``tokens`` int64 ``(B, T)`` and
  ``lengths`` int64 ``(B,)``, ``B`` and ``T`` dynamic (``1 <= T <= S``, ``1 <= lengths
  <= T``, ids in ``[0, V)``); output ``logits`` float ``(B, T, V)``, meaningful at
  positions ``< lengths``.
- ``"decode"`` (:func:`~microgpt_xp.decode_step`, one position of a batch through the
  KV cache): inputs ``token_ids`` int64 ``(B,)``, ``keys_0 .. keys_{L-1}`` and
  ``values_0 .. values_{L-1}`` float ``(S, C, B)`` (``keys_l`` is ``KVCache.keys[l]``:
  positions, channels, one column per sequence; start from zeros) and ``pos`` int64
  ``()`` (positions decoded so far, start from 0, at most ``S - 1``); outputs ``logits``
  float ``(B, V)``, ``new_keys_l`` and ``new_values_l`` float ``(S, C, B)`` for each
  layer ``l`` and ``new_pos`` int64 ``()`` (``pos + 1``): each output ``new_X`` is the
  next step's input ``X``. (One buffer per layer rather than one stacked array: stacking
  would copy every buffer twice a step.)

The graphs do not validate their inputs the way :func:`~microgpt_xp.forward` does: with
onnxruntime, ``T > S``, an empty batch, a decode step at ``pos >= S`` or a decode id
outside ``[0, V)`` fail in an indexing node; in the forward graph, ids outside ``[0,
V)`` at real positions or lengths outside ``[1, T]`` give meaningless logits.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import _xp
from ._backends import install_extra
from ._files import atomic_write
from ._version import __version__
from .data import Tokenizer
from .model import KVCache, decode_step, forward
from .params import Params

#: The graphs :func:`export_onnx` builds.
GRAPHS: tuple[str, ...] = ("forward", "decode")

#: protobuf cannot serialize a message of 2 GiB or more (ONNX's single-file limit).
_MAX_BYTES = 2**31 - 1


def export_onnx(
    params: Params,
    path: str | Path,
    *,
    graph: str = "forward",
    tokenizer: Tokenizer | None = None,
) -> Path:
    """Write the model as a standalone ONNX file (the weights inside, as initializers).

    Args:
        params: the weights, on any backend (ndonnx's included, eager), float32 or
            float64 (the graph computes in that dtype).
        path: the file to write (replaced atomically; missing folders are made).
        graph: ``"forward"`` (whole sequences, :func:`~microgpt_xp.forward`) or
            ``"decode"`` (one KV-cache step, :func:`~microgpt_xp.decode_step`); inputs and
            outputs as in :mod:`microgpt_xp.export`.
        tokenizer: the model's :class:`~microgpt_xp.Tokenizer`, if any: stored in the
            model's ``metadata_props`` as ``microgpt_xp.tokenizer``, ``{"chars": "..."}``
            in JSON (BOS is ``len(chars)``), so that the file alone can decode samples.
            ``microgpt_xp.graph``, ``microgpt_xp.config`` (the
            :class:`~microgpt_xp.GPTConfig` in JSON) and ``microgpt_xp.version`` are
            always stored. onnxruntime returns them from
            ``InferenceSession.get_modelmeta().custom_metadata_map``.

    Returns:
        The path written.

    Raises ``TypeError`` for params that are not a :class:`~microgpt_xp.Params` or a
    tokenizer that is not a :class:`~microgpt_xp.Tokenizer`, ``ValueError`` for an
    unknown graph, a tokenizer of another vocabulary size or a model of 2 GiB or more,
    and ``ImportError`` (saying what to install) without ndonnx or onnx.
    """
    model = onnx_model(params, graph=graph, tokenizer=tokenizer)
    size = model.ByteSize()
    if size > _MAX_BYTES:
        raise ValueError(f"the ONNX model takes {size} bytes, past protobuf's 2 GiB limit")
    return atomic_write(path, model.SerializeToString())


def onnx_model(
    params: Params, *, graph: str = "forward", tokenizer: Tokenizer | None = None
) -> Any:
    """The ``onnx.ModelProto`` that :func:`export_onnx` writes, in memory."""
    if not isinstance(params, Params):
        raise TypeError(f"params must be a Params, got {type(params).__name__}")
    if graph not in GRAPHS:
        raise ValueError(f"unknown graph {graph!r}; choose one of {', '.join(GRAPHS)}")
    props = _metadata(params, graph, tokenizer)
    ndx, onnx = _modules()
    on_ndonnx = Params.trusted(
        params.config, {name: ndx.asarray(_host(a, ndx)) for name, a in params.arrays().items()}
    )
    inputs, outputs, shapes = _BUILDERS[graph](on_ndonnx, ndx)
    model = ndx.build(inputs, outputs)
    _constants_to_initializers(model.graph, onnx)
    _declare_output_shapes(model.graph, shapes)
    onnx.helper.set_model_props(model, {**_props(model), **props})
    onnx.checker.check_model(model, full_check=True)  # also checks the shapes declared
    return model


def _modules() -> tuple[Any, Any]:
    """``(ndonnx, onnx)``, or ``ImportError`` saying how to install them."""
    try:
        import ndonnx
        import onnx
    except ImportError as exc:
        raise ImportError(f"ONNX export needs ndonnx and onnx: {install_extra('onnx')}") from exc
    return ndonnx, onnx


def _host(a: Any, ndx: Any) -> Any:
    """The values of a weight as a NumPy array (ndonnx's own arrays through
    ``unwrap_numpy``, which raises for lazy ones: weights must have values)."""
    return a.unwrap_numpy() if isinstance(a, ndx.Array) else _xp.to_numpy(a)


def _metadata(params: Params, graph: str, tokenizer: Tokenizer | None) -> dict[str, str]:
    """The ``metadata_props`` of the model: what it is, and its tokenizer if given."""
    props = {
        "microgpt_xp.graph": graph,
        "microgpt_xp.config": json.dumps(params.config.to_dict()),
        "microgpt_xp.version": __version__,
    }
    if tokenizer is None:
        return props
    if not isinstance(tokenizer, Tokenizer):
        raise TypeError(f"tokenizer must be a Tokenizer, got {type(tokenizer).__name__}")
    if tokenizer.vocab_size != params.config.vocab_size:
        raise ValueError(
            f"tokenizer has {tokenizer.vocab_size} ids but the model {params.config.vocab_size}"
        )
    return {**props, "microgpt_xp.tokenizer": json.dumps(tokenizer.to_dict())}


def _props(model: Any) -> dict[str, str]:
    """The model's current ``metadata_props`` (ndonnx writes its schema there)."""
    return {p.key: p.value for p in model.metadata_props}


# -- the two graphs: the model's public functions on ndonnx arguments -------------------------
#: ``(inputs, outputs, shapes)``: named ndonnx arguments and results, and the documented
#: shape of each output (ints, or names of dynamic dimensions).
Graph = tuple[dict[str, Any], dict[str, Any], dict[str, tuple[int | str, ...]]]


def _forward_graph(params: Params, ndx: Any) -> Graph:
    """``tokens (batch, time)``, ``lengths (batch,)`` -> ``logits (batch, time, V)``."""
    tokens = ndx.argument(shape=("batch", "time"), dtype=ndx.int64)
    lengths = ndx.argument(shape=("batch",), dtype=ndx.int64)
    logits = forward(params, tokens, lengths)
    shape = ("batch", "time", params.config.vocab_size)
    return {"tokens": tokens, "lengths": lengths}, {"logits": logits}, {"logits": shape}


def _decode_graph(params: Params, ndx: Any) -> Graph:
    """One :func:`decode_step`, each layer's keys and values an input and an output of
    their own (stacking them would copy every buffer twice a step)."""
    cfg = params.config
    shape = (cfg.block_size, cfg.n_embd, "batch")
    layers = range(cfg.n_layer)

    def cache_inputs(kind: str) -> dict[str, Any]:
        return {f"{kind}_{i}": ndx.argument(shape=shape, dtype=params.dtype) for i in layers}

    token_ids = ndx.argument(shape=("batch",), dtype=ndx.int64)
    keys, values = cache_inputs("keys"), cache_inputs("values")
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


_BUILDERS: dict[str, Callable[[Params, Any], Graph]] = {
    "forward": _forward_graph,
    "decode": _decode_graph,
}


def _constants_to_initializers(graph: Any, onnx: Any) -> None:
    """Move the tensors of the top-level ``Constant`` nodes (the weights among them) into
    ``graph.initializer``, where ONNX tools look for weights (constants inside
    subgraphs, a few scalars, stay as they are)."""
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


def _declare_output_shapes(graph: Any, shapes: dict[str, tuple[int | str, ...]]) -> None:
    """Write the documented shapes into the outputs' type information, which ndonnx leaves
    unknown where a dimension is dynamic (runtimes and viewers show it to users)."""
    for value in graph.output:
        dims = value.type.tensor_type.shape.dim
        del dims[:]
        for size in shapes[value.name]:
            if isinstance(size, str):
                dims.add().dim_param = size
            else:
                dims.add().dim_value = size
