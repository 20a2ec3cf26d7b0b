"""The model as a standalone ONNX file: the model's own code traced on ndonnx's lazy arrays, its
weights as initializers (the graphs: docs/own-namespace.md, "The model as an ONNX graph")."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np

from . import _xp
from . import primitives as P
from ._backends import install_extra
from ._errors import ArgumentTypeError, ArgumentValueError
from ._files import atomic_open
from ._version import __version__
from .data import Tokenizer, check_tokenizer
from .model import KVCache, decode_step, forward, loss_and_grads
from .optim import AdamConfig, adam_arrays, adam_init
from .params import Params, flatten, unflatten
from .sample import _position

if TYPE_CHECKING:
    from typing_extensions import Unpack

#: protobuf cannot serialize a message of 2 GiB or more (ONNX's single-file limit).
_MAX_BYTES = 2**31 - 1
Graph = tuple[dict[str, Any], dict[str, Any], dict[str, tuple[int | str, ...]]]


class ExportOptions(TypedDict, total=False):
    """The keywords of :func:`export_onnx`: ``graph`` (of :data:`GRAPHS`, default ``"forward"``);
    ``tokenizer`` (stored); ``batch``, ``time`` (fixed ``B``/``T``, else dynamic; ``time`` for
    ``forward``, ``train_step``); ``optimizer`` (of the train graphs); ``mode`` (``"docs"``,
    ``"text"``, stored)."""

    graph: str
    tokenizer: Tokenizer | None
    batch: int | None
    time: int | None
    optimizer: AdamConfig | None
    mode: str


def export_onnx(params: Params, path: str | Path, **options: Unpack[ExportOptions]) -> Path:
    """Write the model (float32 or float64 ``params``, any backend) as a standalone ONNX file,
    replaced atomically, and return its path. ``TypeError``/``ValueError`` for bad options or a
    model of 2 GiB or more (checked before building), ``ImportError`` without ndonnx or onnx."""
    model, weights = _build(params, True, options)
    with atomic_open(Path(path), "wb") as f:  # the weights one at a time: no copy of it all
        f.write(model.SerializeToString())
        for tensor in weights:
            f.write(_as_initializer_field(tensor))
    return Path(path)


def onnx_model(params: Params, *, clean: bool = True, **options: Unpack[ExportOptions]) -> Any:
    """The ``onnx.ModelProto`` that :func:`export_onnx` writes; ``clean=False`` keeps
    ndonnx's zero-size guards and NaN checks (see :func:`_clean`)."""
    model, weights = _build(params, clean, options)
    model.graph.initializer.extend(weights)
    return model


def _build(params: Params, clean: bool, options: ExportOptions) -> tuple[Any, list[Any]]:
    """The checked model without the weights' initializers, and those (``TensorProto``s)."""
    unknown = set(options) - set(ExportOptions.__annotations__)
    if unknown:
        raise TypeError(f"unexpected export options {sorted(unknown)}")
    props = _metadata(params, **options)
    graph = props["microgpt_xp.graph"]
    try:
        import ndonnx as ndx
        import onnx
    except ImportError as exc:
        raise ImportError(f"ONNX export needs ndonnx and onnx: {install_extra('onnx')}") from exc
    if graph == "train_init":
        model, host, weights = _initial_state_model(params, onnx), {}, {}
    else:
        # the weights traced as inputs (no copies), made initializers once the model is checked
        host = {
            k: a.unwrap_numpy() if isinstance(a, ndx.Array) else np.asarray(_xp.to_numpy(a))
            for k, a in params.arrays().items()
        }
        weights = {
            k: ndx.argument(shape=h.shape, dtype=getattr(ndx, h.dtype.name))
            for k, h in host.items()
        }
        sizes, opts = {"batch": options.get("batch"), "time": options.get("time")}, {}
        if graph == "train_step":  # the weights are the graph's own inputs
            opts, weights = {"optimizer": options.get("optimizer") or AdamConfig()}, {}
        inputs, outputs, shapes = _BUILDERS[graph](
            Params.trusted(params.config, weights or host), ndx, sizes, **opts
        )
        model = ndx.build({**inputs, **weights}, outputs)
        _constants_to_initializers(model.graph)
        for value in model.graph.output:  # ndonnx leaves the dynamic dimensions unknown
            elem, shape = value.type.tensor_type.elem_type, shapes[value.name]
            value.CopyFrom(onnx.helper.make_tensor_value_info(value.name, elem, shape))
        if clean:
            _clean(model.graph)
            if graph in _OPTIMIZED:
                model = _optimized(model)
            _constants_to_initializers(model.graph)  # those of the inlined branches
    old = {p.key: p.value for p in model.metadata_props}  # ndonnx's schema
    onnx.helper.set_model_props(model, {**old, **props})
    onnx.checker.check_model(model, full_check=True)  # the weights inputs: no copy of them
    used = set().union(*(_uses(n) for n in model.graph.node))
    kept = [v for v in model.graph.input if v.name not in weights]
    del model.graph.input[:]
    model.graph.input.extend(kept)
    return model, [onnx.numpy_helper.from_array(host[k], k) for k in weights if k in used]


def _as_initializer_field(tensor: Any) -> bytes:
    """``tensor`` as a ``ModelProto`` whose graph's one initializer it is: appended to a model's
    bytes, protobuf merges it into that graph."""
    data: bytes = tensor.SerializeToString()
    for number in (5, 7):  # GraphProto.initializer inside ModelProto.graph
        n, head = len(data), bytearray([number << 3 | 2])  # tag, varint length, payload
        while n >= 0x80:
            head.append(n & 0x7F | 0x80)
            n >>= 7
        data = bytes(head) + bytes([n]) + data
    return data


def _metadata(
    params: Params,
    graph: str = "forward",
    tokenizer: Tokenizer | None = None,
    batch: int | None = None,
    time: int | None = None,
    optimizer: AdamConfig | None = None,
    mode: str = "docs",
) -> dict[str, str]:
    """:class:`ExportOptions` checked (their defaults here) -> the ``microgpt_xp.*`` metadata."""
    if not isinstance(params, Params):
        raise ArgumentTypeError("params", f"params must be a Params, got {type(params).__name__}")
    if graph not in GRAPHS:
        raise ArgumentValueError(
            "graph", f"unknown graph {graph!r}; choose one of {', '.join(GRAPHS)}"
        )
    cfg = params.config
    if batch is not None:
        _xp.check_positive_int(batch, "batch")
    if time is not None:
        if graph not in ("forward", "train_step"):
            raise ArgumentValueError("time", f"time is fixed by the {graph} graph itself")
        _xp.check_positive_int(time, "time", most=cfg.block_size + (graph == "train_step"))
    if optimizer is not None and not isinstance(optimizer, AdamConfig):
        raise ArgumentTypeError("optimizer", "optimizer must be an AdamConfig")
    if mode not in ("docs", "text"):
        raise ArgumentValueError("mode", f"mode must be 'docs' or 'text', got {mode!r}")
    weights = cfg.num_params * np.dtype(_xp.dtype_name(params.wte)).itemsize  # none read
    stored = {"train_step": 0, "train_init": 3 * weights}.get(graph, weights)
    if stored > _MAX_BYTES:
        raise ArgumentValueError(
            "params", f"the {graph} graph would hold {stored} bytes, past protobuf's 2 GiB limit"
        )
    props = {
        "microgpt_xp.graph": graph,
        "microgpt_xp.config": json.dumps(cfg.to_dict()),
        "microgpt_xp.version": __version__,
        "microgpt_xp.mode": mode,
    }
    if graph.startswith("train"):
        props["microgpt_xp.optimizer"] = json.dumps(dataclasses.asdict(optimizer or AdamConfig()))
    if tokenizer is not None:
        check_tokenizer(tokenizer, cfg.vocab_size)
        props["microgpt_xp.tokenizer"] = json.dumps(tokenizer.to_dict())
    return props


# -- the builders: the params on ndonnx, ndonnx, the fixed sizes -> (inputs, outputs, shapes) --
def _forward_graph(params: Params, ndx: Any, sizes: dict[str, int | None]) -> Graph:
    b, t = (sizes[k] or k for k in ("batch", "time"))
    tokens = ndx.argument(shape=(b, t), dtype=ndx.int64)
    lengths = ndx.argument(shape=(b,), dtype=ndx.int64)
    logits = forward(params, tokens, lengths)
    shape = (b, t, params.config.vocab_size)
    return {"tokens": tokens, "lengths": lengths}, {"logits": logits}, {"logits": shape}


def _decode_graph(params: Params, ndx: Any, sizes: dict[str, int | None]) -> Graph:
    cfg = params.config
    b = sizes["batch"] or "batch"
    shape = (cfg.block_size, cfg.n_embd, b)
    names = [f"{kind}_{i}" for kind in ("keys", "values") for i in range(cfg.n_layer)]
    token_ids = ndx.argument(shape=(b,), dtype=ndx.int64)
    bufs = {name: ndx.argument(shape=shape, dtype=params.dtype) for name in names}
    pos = ndx.argument(shape=(), dtype=ndx.int64)
    keys, values = list(bufs.values())[: cfg.n_layer], list(bufs.values())[cfg.n_layer :]
    logits, new = decode_step(params, token_ids, KVCache(tuple(keys), tuple(values), pos))
    outputs = {
        "logits": logits,
        **{f"new_{name}": a for name, a in zip(names, (*new.keys, *new.values), strict=True)},
        "new_pos": new.pos,
    }
    shapes: dict[str, tuple[int | str, ...]] = {name: shape for name in outputs}
    shapes.update({"logits": (b, cfg.vocab_size), "new_pos": ()})
    return {"token_ids": token_ids, **bufs, "pos": pos}, outputs, shapes


def _generate_graph(params: Params, ndx: Any, sizes: dict[str, int | None]) -> Graph:
    """An ONNX ``Loop`` over the positions carrying ``(token, done, rows, keys.., values..,
    pos)`` of the rows still running (``rows``: their indices in the batch), a position's
    ids (``BOS`` at rows that ended) a scan output, going while a row has not drawn BOS. The
    caches start empty and grow by a slot a position (``cache_write``'s ndonnx form:
    attention over the slots seen); the rows that ended are dropped from everything carried
    once they are a quarter of those carried, as the sampler drops them."""
    from .primitives._ndonnx import op

    cfg = params.config
    xp, s, n, dtype = ndx, cfg.block_size, cfg.n_layer, params.dtype
    b = sizes["batch"] or "batch"
    bos = ndx.asarray(cfg.vocab_size - 1, dtype=ndx.int64)
    uniforms = ndx.argument(shape=(b, s), dtype=dtype)
    temperature = ndx.argument(shape=(), dtype=dtype)
    # 1 / temperature computed in float64 and rounded, as the sampler's Python float is
    inv_t = xp.astype(1.0 / xp.astype(temperature, xp.float64), dtype)
    u_t = xp.permute_dims(uniforms, (1, 0))  # (S, B): a position's uniforms are a row
    token0 = xp.astype(xp.zeros_like(uniforms[:, 0]), xp.int64) + bos
    rows0 = xp.cumulative_sum(xp.astype(token0 == token0, xp.int64)) - 1  # 0..B-1, B unknown
    empty = xp.zeros_like(uniforms[:, 0])[None, None, :] * xp.zeros((0, cfg.n_embd, 1), dtype=dtype)

    def body(_i: Any, _cond: Any, *carried: Any) -> list[Any]:
        token, done, rows, *bufs, pos = (ndx.asarray(v) for v in carried)
        cache = KVCache(tuple(bufs[:n]), tuple(bufs[n:]), pos)
        u = P.keep_columns(xp.take(u_t, xp.reshape(pos, (1,)), axis=0)[0, :], rows)
        token, cache, done, row = _position(
            params, cache, token, u, done, bos, inv_t, greedy=False, top_k=None
        )
        ended, count = (xp.sum(xp.astype(a, xp.int64)) for a in (done, done == done))
        going = ended < count  # not ndonnx's `all`: a ReduceMin that fails on 0 rows unguarded
        ids = op.scatter_elements(*(a.unwrap_spox() for a in (token0, rows, row)), axis=0)
        state = [token, done, rows, *cache.keys, *cache.values]
        keep = xp.nonzero(xp.logical_not(done))[0]

        def kept() -> list[Any]:
            return [P.keep_columns(a, keep).unwrap_spox() for a in state]

        carried_on = op.if_(
            (4 * ended >= count).unwrap_spox(),  # measured: as good as 1/8, better than 1/2
            then_branch=kept,
            else_branch=lambda: [op.identity(a.unwrap_spox()) for a in state],
        )
        return [going.unwrap_spox(), *carried_on, cache.pos.unwrap_spox(), ids]

    initial = [
        token0,
        token0 != token0,
        rows0,
        *(empty,) * (2 * n),
        ndx.asarray(0, dtype=ndx.int64),
    ]
    trips, cond = ndx.asarray(s, dtype=ndx.int64), ndx.asarray(True)
    # the rows and the slots change from one position to the next, the channels do not
    sizes_change = {
        0: (None,),
        1: (None,),
        2: (None,),
        **{3 + i: (None, cfg.n_embd, None) for i in range(2 * n)},
    }
    ran = _loop(trips, cond, initial, body, sizes_change)[-1]  # (positions run, B)
    ids = xp.concat([ndx.asarray(ran), xp.astype(xp.zeros_like(u_t), xp.int64) + bos], axis=0)
    ids = xp.permute_dims(ids[:s, :], (1, 0))
    return {"uniforms": uniforms, "temperature": temperature}, {"ids": ids}, {"ids": (b, s)}


def _loop(
    trips: Any, cond: Any, initial: list[Any], body: Any, shapes: dict[int, tuple[Any, ...]]
) -> list[Any]:
    """An ONNX ``Loop`` whose body takes the iteration and condition as scalars (spox's
    ``loop`` declares them ``(1,)``, which shape inference rejects); the carried values
    ``initial[i]`` for ``i`` in ``shapes`` have the shape ``shapes[i]`` (``None`` where a size
    changes from one iteration to the next)."""
    from spox._attributes import AttrGraph
    from spox._graph import subgraph
    from spox._type_system import Tensor
    from spox._var import unwrap_vars

    from .primitives._ndonnx import op

    spox = [a.unwrap_spox() for a in initial]
    carried = [v.unwrap_type() for v in spox]
    for i, shape in shapes.items():
        carried[i] = Tensor(carried[i].unwrap_tensor().dtype, shape)
    types = [Tensor(np.int64, ()), Tensor(np.bool_, ()), *carried]
    graph = subgraph(types, body)
    node = op._Loop(
        op._Loop.Attributes(body=AttrGraph(graph, name="body")),
        op._Loop.Inputs(
            M=unwrap_vars(trips.unwrap_spox()),
            cond=unwrap_vars(cond.unwrap_spox()),
            v_initial=unwrap_vars(spox),
        ),
        out_variadic=len(graph.requested_results) - 1,
    )
    return list(node.get_output_vars().v_final_and_scan_outputs)  # type: ignore[arg-type]


def _train_step_graph(
    params: Params, ndx: Any, sizes: dict[str, int | None], *, optimizer: AdamConfig
) -> Graph:
    cfg = params.config
    b, t = (sizes[k] or k for k in ("batch", "time"))
    tokens = ndx.argument(shape=(b, t), dtype=ndx.int64)
    lengths = ndx.argument(shape=(b,), dtype=ndx.int64)
    state = {
        k: ndx.argument(shape=a.shape, dtype=getattr(ndx, a.dtype.name))
        for k, a in _state(params).items()
    }
    weights = Params.trusted(cfg, {k: state[k] for k in params.arrays()})
    loss, grads = loss_and_grads(weights, tokens, lengths)  # train_step's two halves
    # Adam is elementwise: traced once over the flat vectors (the moments' own layout), where
    # weight by weight costs ~130 more nodes (~35% of the graph)
    new_flat, new_m, new_v, new_step = adam_arrays(
        {"all": flatten(weights)},
        {"all": flatten(grads)},
        {"all": state["adam_m"]},
        {"all": state["adam_v"]},
        state["adam_step"],
        optimizer,
    )
    new = {
        **unflatten(new_flat["all"], cfg).arrays(),
        "adam_m": new_m["all"],
        "adam_v": new_v["all"],
        "adam_step": new_step,
    }
    outputs = {"loss": loss, **{f"new_{k}": new[k] for k in state}}
    shapes = {"loss": (), **{f"new_{k}": tuple(a.shape) for k, a in state.items()}}
    return {"tokens": tokens, "lengths": lengths, **state}, outputs, shapes


def _state(params: Params) -> dict[str, Any]:
    """The train_step graph's initial state: the weights, Adam's flat moments and step."""
    adam = adam_init(params)
    moments = {"adam_m": flatten(adam.m), "adam_v": flatten(adam.v)}
    return {**params.arrays(), **moments, "adam_step": adam.step}


def _initial_state_model(params: Params, onnx: Any) -> Any:
    """The ``train_init`` graph: one ``Constant`` per state tensor (onnxruntime-web feeds no
    input that is also an initializer)."""
    helper, nodes, outputs = onnx.helper, [], []
    for name, value in _state(params).items():
        host = np.asarray(_xp.to_numpy(value))
        tensor = onnx.numpy_helper.from_array(host, f"{name}_value")
        nodes.append(helper.make_node("Constant", [], [name], value=tensor))
        outputs.append(helper.make_tensor_value_info(name, tensor.data_type, list(host.shape)))
    graph = helper.make_graph(nodes, "train_init", [], outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


_BUILDERS: dict[str, Callable[..., Graph]] = {
    "forward": _forward_graph,
    "decode": _decode_graph,
    "generate": _generate_graph,
    "train_step": _train_step_graph,
}
#: The graphs :func:`export_onnx` writes (the CLI's ``--graph`` choices).
GRAPHS = (*_BUILDERS, "train_init")


# -- the clean-up of the traced graph (measured: benchmarks/onnx_graphs.py) ------------------
def _constants_to_initializers(graph: Any) -> None:
    """Move the tensors of ``Constant`` nodes into ``graph.initializer``: all of the main
    graph's, and subgraphs' of 16 elements or more (the ``Loop`` body's weights)."""
    outputs = {o.name for o in graph.output}

    def walk(g: Any, top: bool) -> None:
        kept = []
        for node in g.node:
            for attr in node.attribute:
                if attr.type == attr.GRAPH:
                    walk(attr.g, False)
            attrs = node.attribute
            value = attrs[0] if node.op_type == "Constant" and len(attrs) == 1 else None
            if (
                value is not None
                and value.name == "value"
                and node.output[0] not in outputs
                and (top or int(np.prod(value.t.dims)) >= 16)
            ):
                tensor = graph.initializer.add()
                tensor.CopyFrom(value.t)
                tensor.name = node.output[0]
                value.t.Clear()
            else:
                kept.append(node)
        if len(kept) < len(g.node):
            del g.node[:]
            g.node.extend(kept)

    walk(graph, True)


def _clean(graph: Any) -> None:
    """Remove, in place and in subgraphs, ndonnx's zero-size guards ``If(Equal(<product of
    Size>, 0))`` (their ``else`` branch kept) and NaN checks ``Where(ReduceMax(IsNaN(x)), NaN,
    ReduceMax(x))`` (a NaN still reaches ``x - max``), then the ``Identity`` chains they
    leave (:func:`_bypass_identities`), a ``Loop`` body's invariant nodes
    (:func:`_hoist_invariants`) and what nothing uses."""
    from onnx import helper, numpy_helper

    small = {t.name: t for t in graph.initializer if int(np.prod(t.dims)) == 1}

    def scalar(name: str, consts: dict[str, Any]) -> Any:
        t = consts.get(name, small.get(name))
        return None if t is None else numpy_helper.to_array(t).reshape(-1)[0]

    def walk(g: Any) -> None:
        producer = {o: n for n in g.node for o in n.output}
        consts = {
            n.output[0]: n.attribute[0].t
            for n in g.node
            if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value"
        }

        def through(name: str) -> Any:  # the node behind reshapes and casts
            n = producer.get(name)
            while n is not None and n.op_type in ("Identity", "Squeeze", "Unsqueeze", "Cast"):
                n = producer.get(n.input[0])
            return n

        def from_sizes(name: str) -> bool:
            n = producer.get(name)
            if n is not None and n.op_type in ("Mul", "Identity", "Cast"):
                return all(from_sizes(i) for i in n.input)
            return n is not None and n.op_type == "Size"

        def guard(node: Any) -> bool:
            cond = producer.get(node.input[0]) if node.op_type == "If" else None
            if cond is None or cond.op_type != "Equal":
                return False
            a, b = cond.input
            return any(from_sizes(x) and scalar(y, consts) == 0 for x, y in ((a, b), (b, a)))

        def nan_check(node: Any) -> bool:
            if node.op_type != "Where":
                return False
            nan = scalar(node.input[1], consts)
            red = through(node.input[0])
            if nan is None or not np.isnan(nan) or red is None or red.op_type != "ReduceMax":
                return False
            return getattr(through(red.input[0]), "op_type", None) == "IsNaN"

        new = []
        for node in g.node:
            for attr in node.attribute:
                if attr.type == attr.GRAPH:
                    walk(attr.g)
            if guard(node):
                branch = next(a.g for a in node.attribute if a.name == "else_branch")
                new.extend(branch.node)
                for out, res in zip(node.output, branch.output, strict=True):
                    new.append(helper.make_node("Identity", [res.name], [out]))
            elif nan_check(node):
                new.append(helper.make_node("Identity", [node.input[2]], [node.output[0]]))
            else:
                new.append(node)
        needed, live = {o.name for o in g.output}, []  # without what nothing uses
        for node in reversed(new):
            if any(o in needed for o in node.output):
                live.append(node)
                needed |= _uses(node)
        del g.node[:]
        g.node.extend(live[::-1])

    for _ in range(2):  # the second pass finds the NaN checks of the guards' inlined branches
        walk(graph)
    _bypass_identities(graph)
    _hoist_invariants(graph)
    used = {o.name for o in graph.output}.union(*(_uses(n) for n in graph.node))
    for i in reversed(range(len(graph.initializer))):  # in place: no copies
        if graph.initializer[i].name not in used:
            del graph.initializer[i]


def _bypass_identities(graph: Any) -> None:
    """Remove, in place and in subgraphs, ``Identity`` nodes (the inlined branches leave
    chains of them): a use of an Identity's output reads its input instead, and a graph
    output made by one is written by the node behind it. onnxruntime keeps an Identity
    that makes a subgraph's output, and it copies: every step of the generate graph's
    ``Loop`` copied its caches."""

    def walk(g: Any) -> None:
        outputs = {o.name for o in g.output}
        made_here = {o for n in g.node for o in n.output}
        names: dict[str, str] = {}  # old name -> new name, in g and its subgraphs
        kept, writers = [], {}
        for node in g.node:
            if node.op_type != "Identity":
                kept.append(node)
                continue
            x, y = names.get(node.input[0], node.input[0]), node.output[0]
            if y not in outputs:
                names[y] = x
            elif x in made_here and x not in outputs and x not in writers:
                writers[x] = y  # the node that makes x makes the output y
            else:
                kept.append(node)
        for node in kept:
            for attr in node.attribute:
                if attr.type == attr.GRAPH:
                    walk(attr.g)
        del g.node[:]
        g.node.extend(kept)
        rename(g, {old: writers.get(new, new) for old, new in names.items()} | writers)

    def rename(g: Any, names: dict[str, str]) -> None:
        for node in g.node:
            node.input[:] = [names.get(i, i) for i in node.input]
            node.output[:] = [names.get(o, o) for o in node.output]
            for attr in node.attribute:
                if attr.type == attr.GRAPH:
                    rename(attr.g, names)

    walk(graph)


def _hoist_invariants(graph: Any) -> None:
    """Move, in place, the nodes of a ``Loop`` body that read nothing the loop changes (the
    weights' slices, ``lm_head / temperature``) before the ``Loop``: computed once, not at
    every position (onnxruntime does not hoist them). Random draws stay in the body."""
    new = []
    for node in graph.node:
        if node.op_type == "Loop":
            body = next(a.g for a in node.attribute if a.name == "body")
            changing = {i.name for i in body.input}
            made_out = {o.name for o in body.output}
            kept = []
            for n in body.node:
                inner = any(a.type == a.GRAPH for a in n.attribute)
                fresh = n.op_type.startswith("Random") or n.op_type in ("Bernoulli", "Multinomial")
                if (
                    inner
                    or fresh
                    or changing.intersection(n.input)
                    or made_out.intersection(n.output)
                ):
                    changing.update(n.output)
                    kept.append(n)
                else:
                    new.append(n)
            del body.node[:]
            body.node.extend(kept)
        new.append(node)
    del graph.node[:]
    graph.node.extend(new)


#: The graphs that onnxscript's optimizer speeds up (measured: benchmarks/onnx_graphs.py).
_OPTIMIZED = ("forward", "train_step")


def _optimized(model: Any) -> Any:
    """``model`` through onnxscript's constant folding and its shape and layout rewrites,
    where installed (the ``[onnx]`` extra brings it): shape computations folded, reshapes,
    casts, slices and transposes merged, fewer nodes. Not its whole default optimizer: its
    no-op rules take a constant within 1e-8 of 0 for 0 (Adam's ``eps``). The weights are
    still inputs here, so nothing of their size is folded."""
    try:
        import onnx_ir
        from onnx_ir.passes import common as passes
        from onnxscript import optimizer, rewriter
        from onnxscript.rewriter.rules import common as rules
    except ImportError:
        return model
    ir = onnx_ir.serde.deserialize_model(model)
    chosen = [
        rules.cast_cast_rule, rules.no_op_cast_rule, rules.no_op_expand_rule,
        rules.no_op_transpose_rule, rules.reshape_reshape_rule, rules.squeeze_reshape_1d_rule,
        rules.transpose_transpose_rule, rules.unsqueeze_unsqueeze_rule,
        rules.collapse_slice_rule, rules.collapse_slice2_rule,
        rules.materialize_reshape_shape_rule, rules.flatten_to_reshape_rule,
    ]  # fmt: skip
    for _ in range(2):
        optimizer.fold_constants(ir, onnx_shape_inference=True)
        rewriter.rewrite(ir, pattern_rewrite_rules=chosen)
    passes.RemoveUnusedNodesPass()(ir)
    passes.CommonSubexpressionEliminationPass()(ir)
    passes.RemoveUnusedNodesPass()(ir)
    return onnx_ir.serde.serialize_model(ir)


def _uses(node: Any) -> set[str]:
    """The names ``node`` reads, its subgraphs' reads of outer names included."""
    names = set(node.input)
    for attr in node.attribute:
        if attr.type == attr.GRAPH:
            for sub in attr.g.node:
                names |= _uses(sub)
    return names
