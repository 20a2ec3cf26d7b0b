"""Prototype builders of the ``"generate"`` and ``"train_step"`` ONNX graphs (issue 32),
shaped like :mod:`microgpt_xp.export`'s ``_forward_graph``/``_decode_graph``: each takes
the params on ndonnx (constants) and the ndonnx module and returns ``(inputs, outputs,
shapes)`` for ``ndonnx.build``. Phase 2 moves them into ``export.py``'s ``_BUILDERS``.

``"generate"`` (one graph for a whole batch of samples): inputs ``uniforms`` float ``(B,
S)`` (row ``i`` drives sample ``i``, as :func:`~microgpt_xp.sample.row_uniforms` gives
them, in the params' dtype) and ``temperature`` float ``()``; output ``ids`` int64 ``(B,
S)``: the sampled ids, BOS from a row's first sampled BOS on (what
:func:`~microgpt_xp.sample.decode_batch` returns). The positions run in an ONNX ``Loop``
whose body is the library's own position, :func:`microgpt_xp.sample._position` (the
decode step :func:`~microgpt_xp.model.decode_hidden` and the draw), traced on ndonnx
arrays wrapped around the body's spox variables: the only spox here is the ``Loop``
plumbing (the body's inputs wrapped with ``ndonnx.asarray``, its outputs unwrapped with
``Array.unwrap_spox``). The loop stops once every row has drawn BOS; the positions not
run are BOS.

``"train_step"`` (one Adam step of :func:`~microgpt_xp.train_step`): inputs ``tokens``
int64 ``(B, T)`` (``T <= S + 1``), ``lengths`` int64 ``(B,)`` (each ``>= 2``), the
weights under their field names (``wte`` .. ``mlp_fc2``), Adam's moments ``adam_m`` and
``adam_v`` (flat ``(num_params,)``, :func:`~microgpt_xp.params.flatten`'s layout) and
``adam_step`` int64 ``()``; outputs ``loss`` float ``()`` (the batch's loss before the
update) and ``new_<input>`` for every state input (``new_wte`` .. ``new_adam_step``): feed
each ``new_X`` back as the next call's ``X``. Adam's settings are fixed at export.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .model import KVCache, Reduction, _train_step
from .optim import AdamConfig, AdamState, adam_init
from .params import FIELDS, Params
from .sample import LOGIT_BOUND, _position

Graph = tuple[dict[str, Any], dict[str, Any], dict[str, tuple[int | str, ...]]]


def _spox_ops() -> Any:
    """The ONNX opset ndonnx builds with (spox's ``ai.onnx`` v21)."""
    import spox.opset.ai.onnx.v21 as op

    return op


def _loop(trips: Any, cond: Any, initial: list[Any], body: Any) -> list[Any]:
    """An ONNX ``Loop`` (spox's ``v21`` node) whose body takes the iteration number and
    the condition as the scalars ONNX gives it (``spox.opset.ai.onnx.v21.loop`` declares
    them ``(1,)``, which ONNX's shape inference rejects against a scalar condition)."""
    import numpy as np
    from spox._attributes import AttrGraph
    from spox._graph import subgraph
    from spox._type_system import Tensor
    from spox._var import unwrap_vars

    op = _spox_ops()
    types = [Tensor(np.int64, ()), Tensor(np.bool_, ())] + [v.unwrap_type() for v in initial]
    graph = subgraph(types, body)
    node = op._Loop(
        op._Loop.Attributes(body=AttrGraph(graph, name="body")),
        op._Loop.Inputs(
            M=unwrap_vars(trips), cond=unwrap_vars(cond), v_initial=unwrap_vars(initial)
        ),
        out_variadic=len(graph.requested_results) - 1,
    )
    return list(node.get_output_vars().v_final_and_scan_outputs)


def generate_graph(
    params: Params, ndx: Any, *, bos: int | None = None, drop_ended: bool = False
) -> Graph:
    """``uniforms (batch, S)``, ``temperature ()`` -> ``ids (batch, S)`` (see the module).

    The loop carries ``(token, done, keys_0.., values_0.., pos)`` for the rows still
    running; its condition is "some row has not drawn BOS yet". With ``drop_ended``
    (the sampler's own optional step, as :func:`~microgpt_xp.sample.decode_batch` drops
    ended rows), the rows that drew BOS leave the carried batch after each position
    (``take`` of the rest, found by ``nonzero``: the carried shapes change between
    iterations, which ONNX's ``Loop`` allows); the loop also carries ``alive`` (the
    original indices of the rows still running) and ``ids (S, batch)``, into which each
    position's draws are written (``ScatterND`` at ``(pos, alive)``, the one bookkeeping
    operator through spox). Without it (the default), each position's row is a scan
    output. Measured (CPU time, 1 thread, 1,000 rows): dropping every position costs
    2.5x more than it saves, the ``take`` along the caches' last axis being a strided
    gather; the sampler's own rule (drop once a quarter has ended) would need an ``If``."""
    cfg = params.config
    xp = ndx
    s = cfg.block_size
    bos = cfg.vocab_size - 1 if bos is None else bos
    dtype = params.dtype
    uniforms = ndx.argument(shape=("batch", s), dtype=dtype)
    temperature = ndx.argument(shape=(), dtype=dtype)
    # 1 / temperature computed in float64 and rounded, as the sampler's Python float is
    inv_t = xp.astype(1.0 / xp.astype(temperature, xp.float64), dtype)
    u_t = xp.permute_dims(uniforms, (1, 0))  # (S, batch): a position's uniforms are a row
    column = uniforms[:, 0]
    token0 = xp.astype(xp.zeros_like(column), xp.int64) + bos
    done0 = token0 != token0
    zeros = xp.zeros_like(column)[None, None, :] * xp.zeros((s, cfg.n_embd, 1), dtype=dtype)
    cache0 = KVCache(
        (zeros,) * cfg.n_layer, (zeros,) * cfg.n_layer, ndx.asarray(0, dtype=ndx.int64)
    )
    bos_id = ndx.asarray(bos, dtype=ndx.int64)
    n = cfg.n_layer
    ids0 = xp.astype(xp.zeros_like(u_t), xp.int64) + bos  # (S, batch)
    alive0 = xp.cumulative_sum(xp.ones_like(token0)) - 1  # (batch,) the rows' indices

    def body(_i: Any, _cond: Any, *carried: Any) -> list[Any]:
        vals = [ndx.asarray(v) for v in carried]
        token, done, *bufs, pos = vals[: 3 + 2 * n]
        cache = KVCache(tuple(bufs[:n]), tuple(bufs[n:]), pos)
        u = xp.take(u_t, xp.reshape(pos, (1,)), axis=0)[0, :]
        if drop_ended:
            alive, ids = vals[3 + 2 * n :]
            u = xp.take(u, alive, axis=0)
        token, cache, done, row = _position(
            params, cache, token, u, done, bos_id, inv_t, greedy=False, top_k=None
        )
        if not drop_ended:
            going = xp.logical_not(xp.all(done))
            outs = [going, token, done, *cache.keys, *cache.values, cache.pos, row]
            return [a.unwrap_spox() for a in outs]
        ids = _write_column(ids, pos, alive, row)
        running = xp.logical_not(done)
        going = xp.any(running)  # before the rows leave: never over an empty batch
        (keep,) = xp.nonzero(running)
        token, done, alive = (xp.take(a, keep, axis=0) for a in (token, done, alive))
        bufs = [xp.take(b, keep, axis=2) for b in (*cache.keys, *cache.values)]
        outs = [going, token, done, *bufs, cache.pos, alive, ids]
        return [a.unwrap_spox() for a in outs]

    initial = [token0, done0, *cache0.keys, *cache0.values, cache0.pos]
    if drop_ended:
        initial += [alive0, ids0]
    results = _loop(
        ndx.asarray(s, dtype=ndx.int64).unwrap_spox(),
        ndx.asarray(True).unwrap_spox(),
        [a.unwrap_spox() for a in initial],
        body,
    )
    if drop_ended:
        ids = xp.permute_dims(ndx.asarray(results[-1]), (1, 0))
    else:
        ran = xp.permute_dims(ndx.asarray(results[-1]), (1, 0))  # (batch, positions run)
        ids = xp.concat([ran, xp.permute_dims(ids0, (1, 0))], axis=1)[:, :s]
    return (
        {"uniforms": uniforms, "temperature": temperature},
        {"ids": ids},
        {"ids": ("batch", s)},
    )


def _write_column(ids: Any, pos: Any, rows: Any, values: Any) -> Any:
    """``ids (S, B)`` with ``ids[pos, rows] = values`` (``ScatterND``: the standard has
    no indexed write)."""
    import ndonnx

    op = _spox_ops()
    at = ndonnx.stack([ndonnx.zeros_like(rows) + pos, rows], axis=1)  # (n, 2)
    return ndonnx.asarray(op.scatter_nd(ids.unwrap_spox(), at.unwrap_spox(), values.unwrap_spox()))


def greedy_below(dtype: str) -> float:
    """The temperature under which :func:`~microgpt_xp.sample.decode_batch` draws the
    argmax (the generate graph does not: it samples at every temperature it is given)."""
    import numpy as np

    return LOGIT_BOUND / float(np.finfo(dtype).max)


STATE = (*FIELDS, "adam_m", "adam_v", "adam_step")


def train_step_graph(
    params: Params,
    ndx: Any,
    *,
    optimizer: AdamConfig | None = None,
    reduction: Reduction = "mean",
    batch: int | None = None,
    time: int | None = None,
) -> Graph:
    """One :func:`~microgpt_xp.model._train_step` (forward, backward, Adam) with every
    piece of state an input and a ``new_`` output (see the module). ``batch``/``time``
    fix those dimensions (static shapes; dynamic by default)."""
    cfg = params.config
    hp = AdamConfig() if optimizer is None else optimizer
    b = "batch" if batch is None else batch
    t = "time" if time is None else time
    tokens = ndx.argument(shape=(b, t), dtype=ndx.int64)
    lengths = ndx.argument(shape=(b,), dtype=ndx.int64)
    weights = {
        name: ndx.argument(shape=tuple(a.shape), dtype=a.dtype)
        for name, a in params.arrays().items()
    }
    n = cfg.num_params
    m = ndx.argument(shape=(n,), dtype=params.dtype)
    v = ndx.argument(shape=(n,), dtype=params.dtype)
    step = ndx.argument(shape=(), dtype=ndx.int64)
    state_in = Params.trusted(cfg, weights)
    new_params, new_state, loss = _train_step(
        state_in, AdamState(m, v, step), tokens, lengths, reduction=reduction, optimizer=hp
    )
    inputs = {
        "tokens": tokens,
        "lengths": lengths,
        **weights,
        "adam_m": m,
        "adam_v": v,
        "adam_step": step,
    }
    outputs = {
        "loss": loss,
        **{f"new_{k}": a for k, a in new_params.arrays().items()},
        "new_adam_m": new_state.m,
        "new_adam_v": new_state.v,
        "new_adam_step": new_state.step,
    }
    shapes: dict[str, tuple[int | str, ...]] = {"loss": ()}
    shapes.update({f"new_{k}": tuple(a.shape) for k, a in params.arrays().items()})
    shapes.update({"new_adam_m": (n,), "new_adam_v": (n,), "new_adam_step": ()})
    return inputs, outputs, shapes


def patch_model_for_graphs() -> None:
    """PHASE-1 PROTOTYPE ONLY: replace, in this process, the three functions of the model
    that stop ``train_step`` from tracing with a dynamic batch, by the versions phase 2
    puts in place (``model._row_weights``: the batch mean's ``1 / B`` from the data, not
    from ``valid.shape[0]``; ``model._stack_layers``: ``g[None, ...]``, not a reshape to
    ``(1, *g.shape)``, whose dims ndonnx's guarded products leave unknown;
    ``primitives.weight_grad``: a ``tensordot`` over the leading axes where the last
    dimension is unknown). NumPy's results are unchanged (its paths keep the ints)."""
    from . import model as M
    from . import primitives as P
    from ._xp import array_namespace
    from .primitives import _generic as G

    if getattr(M, "_patched_for_graphs", False):
        return

    def _row_weights(n: Any, valid: Any, reduction: str) -> tuple[Any, Any]:
        xp = array_namespace(valid)
        if reduction == "mean":
            inv_n = 1.0 / xp.astype(n, valid.dtype)
            rows = valid.shape[0]
            inv_b = 1.0 / rows if isinstance(rows, int) else 1.0 / xp.sum(xp.ones_like(inv_n))
            return valid * (inv_n * inv_b)[:, None], inv_n
        inv_total = 1.0 / xp.sum(valid)
        return valid * inv_total, inv_total

    def _stack_layers(per_layer: list[Any]) -> Any:
        xp = array_namespace(per_layer[0])
        if len(per_layer) == 1:
            return per_layer[0][None, ...]
        return xp.stack(per_layer, axis=0)

    generic = G.weight_grad

    def weight_grad(dy: Any, x: Any) -> Any:
        if dy.shape[-1] is None or x.shape[-1] is None:
            xp = array_namespace(dy, x)
            lead = list(range(dy.ndim - 1))
            return xp.tensordot(dy, x, axes=(lead, lead))
        return generic(dy, x)

    M._row_weights = _row_weights
    M._stack_layers = _stack_layers
    G.weight_grad = weight_grad
    P.weight_grad = weight_grad
    M._patched_for_graphs = True  # type: ignore[attr-defined]


def initial_state(params: Params) -> dict[str, Any]:
    """The train_step graph's state inputs at the start of training, as NumPy arrays:
    the params' weights and :func:`~microgpt_xp.adam_init`'s moments and step."""
    import numpy as np

    from . import _xp

    state = adam_init(params)
    host = {k: np.asarray(_xp.to_numpy(a)) for k, a in params.arrays().items()}
    host["adam_m"] = np.asarray(_xp.to_numpy(state.m))
    host["adam_v"] = np.asarray(_xp.to_numpy(state.v))
    host["adam_step"] = np.asarray(_xp.to_numpy(state.step), dtype=np.int64)
    return host


# -- a measured clean-up of the traced graph -------------------------------------------------
def unguard(model: Any) -> Any:
    """Remove ndonnx's zero-size guards, in place (the whole graph, ``Loop`` bodies too):
    every ``If`` whose condition is ``Equal(<a product of Size nodes>, 0)`` (ndonnx wraps
    each ``MatMul`` and each reduction in one, so that an empty input gives an empty
    result) is replaced by its ``else`` branch, the non-empty case, inlined; nodes left
    without a consumer are dropped. The graphs take no empty input (an empty batch fails
    in an indexing node anyway), so the results are unchanged; shapes stay dynamic.
    Returns the model."""
    _unguard_graph(model.graph, keep=set())
    return model


def _unguard_graph(graph: Any, keep: set[str]) -> None:
    producer = {o: n for n in graph.node for o in n.output}
    consts = {}
    for n in graph.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
            consts[n.output[0]] = n.attribute[0].t
    for init in graph.initializer:
        consts[init.name] = init

    def is_zero(name: str) -> bool:
        from onnx import numpy_helper

        t = consts.get(name)
        return (
            t is not None
            and numpy_helper.to_array(t).size == 1
            and not numpy_helper.to_array(t).any()
        )

    def from_sizes(name: str) -> bool:
        n = producer.get(name)
        if n is None:
            return False
        if n.op_type == "Size":
            return True
        if n.op_type in ("Mul", "Identity", "Cast"):
            return all(from_sizes(i) for i in n.input)
        return False

    def guard(node: Any) -> bool:
        if node.op_type != "If":
            return False
        cond = producer.get(node.input[0])
        if cond is None or cond.op_type != "Equal":
            return False
        a, b = cond.input
        return (from_sizes(a) and is_zero(b)) or (from_sizes(b) and is_zero(a))

    new_nodes = []
    for node in graph.node:
        for attr in node.attribute:  # Loop bodies, and the branches of other Ifs
            if attr.type == attr.GRAPH:
                _unguard_graph(attr.g, keep)
        if not guard(node):
            new_nodes.append(node)
            continue
        branch = next(a.g for a in node.attribute if a.name == "else_branch")
        new_nodes.extend(branch.node)
        for out, res in zip(node.output, branch.output, strict=True):
            from onnx import helper

            new_nodes.append(helper.make_node("Identity", [res.name], [out]))
    del graph.node[:]
    graph.node.extend(_live(new_nodes, {o.name for o in graph.output}))


def _live(nodes: list[Any], outputs: set[str]) -> list[Any]:
    """``nodes`` without those whose results nothing uses (subgraphs' uses of outer
    names included)."""

    def used_names(node: Any) -> set[str]:
        names = set(node.input)
        for attr in node.attribute:
            if attr.type == attr.GRAPH:
                for sub in attr.g.node:
                    names |= used_names(sub)
        return names

    needed = set(outputs)
    kept = []
    for node in reversed(nodes):
        if any(o in needed for o in node.output):
            kept.append(node)
            needed |= used_names(node)
    return kept[::-1]


# -- the prototype of export_onnx's new graphs (phase 2: export.onnx_model's _BUILDERS) -------
BUILDERS: dict[str, Callable[..., Graph]] = {
    "generate": generate_graph,
    "train_step": train_step_graph,
}


def onnx_graph(
    params: Params,
    graph: str,
    *,
    tokenizer: Any = None,
    clean: bool = True,
    **options: Any,
) -> Any:
    """The ``onnx.ModelProto`` of ``graph`` (``"generate"`` or ``"train_step"``) as
    :func:`microgpt_xp.export.onnx_model` builds its graphs (weights as initializers, the
    documented output shapes, ``microgpt_xp.*`` metadata), then cleaned where ``clean``
    (:func:`unguard`, :func:`drop_nan_checks`). ``options`` go to the builder (``bos=``; ``optimizer=``,
    ``batch=``, ``time=``). Adam's settings go into the metadata as
    ``microgpt_xp.optimizer``."""
    import dataclasses
    import json

    import onnx

    from . import export

    if graph == "train_step":
        patch_model_for_graphs()  # phase 1 only: see the function
    ndx, _ = export._modules()
    props = export._metadata(params, graph, tokenizer)
    if graph == "train_step":
        hp = options.get("optimizer") or AdamConfig()
        props["microgpt_xp.optimizer"] = json.dumps(dataclasses.asdict(hp))
    on_ndonnx = Params.trusted(
        params.config,
        {name: ndx.asarray(export._host(a, ndx)) for name, a in params.arrays().items()},
    )
    inputs, outputs, shapes = BUILDERS[graph](on_ndonnx, ndx, **options)
    model = ndx.build(inputs, outputs)
    export._constants_to_initializers(model.graph, onnx)
    export._declare_output_shapes(model.graph, shapes)
    _hoist_subgraph_constants(model.graph)
    if clean:
        drop_nan_checks(unguard(model))
        _drop_unused_initializers(model.graph)
    onnx.helper.set_model_props(model, {**export._props(model), **props})
    onnx.checker.check_model(model, full_check=True)
    return model


def _hoist_subgraph_constants(graph: Any, min_size: int = 16) -> None:
    """Move the tensors of the ``Constant`` nodes of subgraphs (the ``Loop`` body's
    weights: ndonnx computes ``qkv_weight``'s concatenation and the transposes of
    constants while the body is traced, so they land in the body) with at least
    ``min_size`` elements into the main graph's initializers, where ONNX tools look for
    weights (a subgraph reads the outer scope's names)."""
    import onnx

    def walk(g: Any) -> None:
        kept = []
        for node in g.node:
            for attr in node.attribute:
                if attr.type == attr.GRAPH:
                    walk(attr.g)
            value = node.attribute[0] if node.op_type == "Constant" and node.attribute else None
            if g is not graph and value is not None and value.name == "value":
                size = 1
                for d in value.t.dims:
                    size *= d
                if size >= min_size:
                    tensor = onnx.TensorProto()
                    tensor.CopyFrom(value.t)
                    tensor.name = node.output[0]
                    graph.initializer.append(tensor)
                    continue
            kept.append(node)
        del g.node[:]
        g.node.extend(kept)

    walk(graph)


def _drop_unused_initializers(graph: Any) -> None:
    used: set[str] = set()

    def collect(g: Any) -> None:
        for node in g.node:
            used.update(node.input)
            for attr in node.attribute:
                if attr.type == attr.GRAPH:
                    collect(attr.g)

    collect(graph)
    used.update(o.name for o in graph.output)
    kept = [t for t in graph.initializer if t.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)


def initial_state_model(params: Params) -> Any:
    """A graph without inputs whose outputs are the train_step graph's initial state,
    named like its state inputs (``wte`` .. ``adam_step``): the params and
    :func:`~microgpt_xp.adam_init`'s moments and step. (Initializers named like inputs,
    ONNX's default values, would do in onnxruntime, but onnxruntime-web refuses to feed an
    input it lists as an initializer.) Constants only: no model code."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    nodes, outputs = [], []
    for name, value in initial_state(params).items():
        tensor = numpy_helper.from_array(np.asarray(value), f"{name}_value")
        nodes.append(helper.make_node("Constant", [], [name], value=tensor))
        outputs.append(helper.make_tensor_value_info(name, tensor.data_type, list(value.shape)))
    graph = helper.make_graph(nodes, "train_init", [], outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    onnx.checker.check_model(model, full_check=True)
    return model


def drop_nan_checks(model: Any) -> Any:
    """Remove ndonnx's NaN check around every float ``max`` over an axis, in place (the
    whole graph, ``Loop`` bodies too): ``Where(ReduceMax(IsNaN(x)), NaN, ReduceMax(x))``
    becomes ``ReduceMax(x)``. (ONNX's ``ReduceMax`` need not propagate a NaN; a NaN in
    ``x`` still reaches the results through ``x - max``.) Run after :func:`unguard`."""
    _drop_nan_graph(model.graph)
    return model


def _drop_nan_graph(graph: Any) -> None:
    from onnx import helper, numpy_helper

    producer = {o: n for n in graph.node for o in n.output}
    nan_consts = set()
    for n in graph.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
            v = numpy_helper.to_array(n.attribute[0].t)
            if v.size == 1 and v.dtype.kind == "f" and bool(np_isnan(v)):
                nan_consts.add(n.output[0])

    def through(name: str) -> Any:
        n = producer.get(name)
        while n is not None and n.op_type in ("Identity", "Squeeze", "Unsqueeze", "Cast"):
            n = producer.get(n.input[0])
        return n

    new = []
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == attr.GRAPH:
                _drop_nan_graph(attr.g)
        if node.op_type == "Where" and node.input[1] in nan_consts:
            red = through(node.input[0])
            src = through(red.input[0]) if red is not None and red.op_type == "ReduceMax" else None
            if src is not None and src.op_type == "IsNaN":
                new.append(helper.make_node("Identity", [node.input[2]], [node.output[0]]))
                continue
        new.append(node)
    del graph.node[:]
    graph.node.extend(_live(new, {o.name for o in graph.output}))


def np_isnan(v: Any) -> Any:
    import numpy as np

    return np.isnan(v).all()
