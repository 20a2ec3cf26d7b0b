"""The exported graphs against NumPy, float32, 2 intra-op threads by default:

- ``forward``: the exported forward graph against ``mx.forward``, default model, B=1024;
- ``forward-medium``: the same at ``n_layer=4, n_embd=128, n_head=4, block_size=64``, B=64,
  T=64;
- ``generate``: 10,000 names through the generate graph (one ``session.run`` per batch of
  ``--gen-batch`` rows) against ``mx.sample`` on NumPy, after 100 training steps;
- ``attention`` (not run by default): the causal attention's forward and backward alone at
  the train step's shapes, against NumPy's;
- ``nodes`` (not run by default): the static train_step graph's time by operator, each
  node (after onnxruntime's fusions) timed alone on its real inputs;
- ``train``: one step of the train_step graph against ``mx.train_step`` on NumPy at B=32
  (T=16, default model), state fed back; also the static graph on one intra-op thread
  (``static-1``), NumPy keeping its threads.

Each graph runs as traced (``raw``) and as exported (``clean``: ndonnx's zero-size guards and
NaN checks removed, then onnxscript's folding and rewrites where installed; shapes still
dynamic); for ``train`` also exported with static shapes (``static``). Ratio = NumPy's time /
onnxruntime's, median of the per-round ratios (interleaved rounds, each measurement after
``--gap`` idle seconds, rounds where other processes used the CPUs dropped). onnxruntime
keeps its default threads, which spin between the nodes of a call (set to sleep, the
generate graph took 1.2x as long and the train step 1.3x); the gap lets them, and
OpenBLAS's, stop spinning before the other side runs.

    python -m benchmarks.onnx_graphs [--rounds 7] [--threads 2] [--gap 0.3]
        [--cases forward,forward-medium,generate,train,attention,nodes]
        [--cpu-time]   # CPU seconds of this process instead of the wall clock
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

import numpy as np

import microgpt_xp as mx
from benchmarks.bench.timing import Timed, calibrate, interleave, set_threads, summary


def session(model: Any, threads: int) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def variants(params: Any, graph: str, **static: Any) -> dict[str, Any]:
    """The graph as traced (``raw``), as exported (``clean``: :func:`export.onnx_model`'s
    default), and with ``static`` sizes given, as exported with them (``static``). (The whole
    of onnxscript's default optimizer is not a variant: it takes Adam's ``eps`` for 0.)"""
    from microgpt_xp.export import onnx_model

    out = {
        "raw": onnx_model(params, graph=graph, clean=False),
        "clean": onnx_model(params, graph=graph),
    }
    if static:
        out["static"] = onnx_model(params, graph=graph, **static)
    return out


def compare_cpu(
    numpy_fn: Callable[[], Any], ort_fns: dict[str, Callable[[], Any]], args: Any
) -> str:
    """Interleaved rounds timed by this process's CPU time (all its threads): on a loaded
    machine the figure that other processes distort least (use with ``--threads 1``:
    with more, threads that spin would count)."""
    import time

    fns = {"numpy": numpy_fn, **ort_fns}
    for f in fns.values():
        f()
    rounds: list[dict[str, float]] = []
    for r in range(args.rounds):
        order = list(fns) if r % 2 == 0 else list(fns)[::-1]
        m = {}
        for name in order:
            reps, start = 0, time.process_time()
            while True:
                fns[name]()
                reps += 1
                spent = time.process_time() - start
                if spent >= 0.2:
                    break
            m[name] = spent / reps
        rounds.append(m)
    parts = [f"numpy {1e3 * summary([m['numpy'] for m in rounds])['median']:.2f} ms"]
    for k in ort_fns:
        q = summary([m["numpy"] / m[k] for m in rounds])
        ms = 1e3 * summary([m[k] for m in rounds])["median"]
        parts.append(f"{k} {ms:.2f} ms = {q['median']:.2f}x ({q['q1']:.2f}..{q['q3']:.2f})")
    return "; ".join(parts) + f" [CPU time, {len(rounds)} rounds]"


def compare(numpy_fn: Callable[[], Any], ort_fns: dict[str, Callable[[], Any]], args: Any) -> str:
    if args.cpu_time:
        return compare_cpu(numpy_fn, ort_fns, args)
    contenders = [Timed("numpy", numpy_fn), *(Timed(k, f) for k, f in ort_fns.items())]
    for t in contenders:
        calibrate(t, warmup=2, min_time=0.2)
    rounds = interleave(contenders, args.rounds, max_other=args.max_other, gap=args.gap)
    use = rounds.use()
    parts = [f"numpy {1e3 * summary([m['numpy'] for m in use])['median']:.2f} ms"]
    for k in ort_fns:
        r = summary([m["numpy"] / m[k] for m in use])
        ms = 1e3 * summary([m[k] for m in use])["median"]
        parts.append(f"{k} {ms:.2f} ms = {r['median']:.2f}x ({r['q1']:.2f}..{r['q3']:.2f})")
    clean = "" if rounds.filtered else ", none clean"
    return "; ".join(parts) + f" [{len(use)} rounds, {rounds.dropped} dropped{clean}]"


def forward_case(args: Any, config: Any = None, b: int = 1024, t: int = 16) -> str:
    params = mx.init_params(config or mx.GPTConfig(27), dtype="float32")
    vocab = params.config.vocab_size
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, vocab, size=(b, t))
    lengths = np.full(b, t)
    feed = {"tokens": tokens, "lengths": lengths}
    models = variants(params, "forward")
    sessions = {k: session(m, args.threads) for k, m in models.items()}
    want = mx.forward(params, tokens, lengths)
    scale = float(np.max(np.abs(want)))
    errs = {
        k: float(np.max(np.abs(s.run(None, feed)[0] - want))) / scale for k, s in sessions.items()
    }
    fns = {k: (lambda s=s: s.run(None, feed)) for k, s in sessions.items()}
    counts = {k: len(m.graph.node) for k, m in models.items()}
    line = compare(lambda: mx.forward(params, tokens, lengths), fns, args)
    return line + f"; errors / largest logit {errs}; top-level nodes {counts}"


def forward_medium_case(args: Any) -> str:
    cfg = mx.GPTConfig(27, n_layer=4, n_embd=128, n_head=4, block_size=64)
    return forward_case(args, cfg, b=64, t=64)


def generate_case(args: Any) -> str:
    """``--samples`` names (default 10,000) at temperature 0.5: ``mx.sample`` with its
    defaults (NumPy, ``batch_size`` 1,000, finished rows dropped) against the generate
    graph fed ``--gen-batch`` rows a ``session.run`` (10,000: one call), names decoded on
    both sides, the same uniforms (``seed=1``), drawn in the timed call on both sides."""
    from microgpt_xp.sample import row_uniforms

    result = mx.train(steps=100, dtype="float32")
    params, tokenizer, n = result.params, result.tokenizer, args.samples
    sessions = {k: session(m, args.threads) for k, m in variants(params, "generate").items()}
    width = params.config.block_size
    temp = np.asarray(0.5, dtype=np.float32)
    gb = args.gen_batch

    def run(s: Any) -> list[str]:
        names: list[str] = []
        for a in range(0, n, gb):
            u = row_uniforms(1, a, min(a + gb, n), width).astype(np.float32)
            (ids,) = s.run(None, {"uniforms": u, "temperature": temp})
            names.extend(tokenizer.decode_rows(ids))
        return names

    want = mx.sample(params, tokenizer, n, seed=1)
    same = {k: run(s) == want for k, s in sessions.items()}
    fns = {k: (lambda s=s: run(s)) for k, s in sessions.items()}
    line = compare(lambda: mx.sample(params, tokenizer, n, seed=1), fns, args)
    return line + f"; {gb} rows a call; same names {same}"


def train_setup() -> tuple[Any, np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """The train cases' default model (float32, seed 0), a batch of 32 embedded names padded
    to ``T + 1 = 17`` and the exported initial state: ``(params, tokens, lengths, state0)``."""
    from microgpt_xp.data import Tokenizer, default_docs
    from microgpt_xp.export import onnx_model

    cfg = mx.GPTConfig(27)
    params = mx.init_params(cfg, dtype="float32", seed=0)
    docs = default_docs()
    tok = Tokenizer.from_docs(docs)
    rng = np.random.default_rng(0)
    rows = [
        [tok.bos, *tok.encode(docs[i])[: cfg.block_size - 1], tok.bos]
        for i in rng.integers(0, len(docs), 32)
    ]
    t = cfg.block_size + 1
    tokens = np.array([r + [0] * (t - len(r)) for r in rows], dtype=np.int64)
    lengths = np.array([len(r) for r in rows], dtype=np.int64)
    state = session(onnx_model(params, graph="train_init"), 1)
    state0 = dict(zip([o.name for o in state.get_outputs()], state.run(None, {}), strict=True))
    return params, tokens, lengths, state0


def train_case(args: Any) -> str:
    params, tokens, lengths, state0 = train_setup()
    models = variants(params, "train_step", batch=tokens.shape[0], time=tokens.shape[1])
    sessions = {k: session(m, args.threads) for k, m in models.items()}
    if args.threads > 1:  # at this size a second intra-op thread can cost more than it gives
        sessions["static-1"] = session(models["static"], 1)
    feeds = {k: {"tokens": tokens, "lengths": lengths, **state0} for k in sessions}
    names = {k: [o.name for o in s.get_outputs()] for k, s in sessions.items()}

    def step_ort(k: str) -> None:
        res = dict(zip(names[k], sessions[k].run(None, feeds[k]), strict=True))
        feeds[k] = {"tokens": tokens, "lengths": lengths,
                    **{n[4:]: v for n, v in res.items() if n.startswith("new_")}}  # fmt: skip

    box = {"p": params, "s": mx.adam_init(params)}

    def step_np() -> None:
        box["p"], box["s"], _ = mx.train_step(box["p"], box["s"], tokens, lengths, num_steps=10**9)

    counts = {k: len(m.graph.node) for k, m in models.items()}
    fns = {k: (lambda k=k: step_ort(k)) for k in sessions}
    return compare(step_np, fns, args) + f"; top-level nodes {counts}"


def attention_case(args: Any) -> str:
    """The causal attention's forward and backward alone (``P.causal_attention`` and its
    backward, B=32, T=16, 4 heads of 4 channels: the train step's shapes), traced on ndonnx
    and cleaned as the export does, against the same calls on NumPy: the share of the
    train_step graph's time that is attention."""
    import ndonnx as ndx

    import microgpt_xp.primitives as P
    from microgpt_xp.export import _clean, _optimized

    b, t, h, d = 32, 16, 4, 4
    qkv_a = ndx.argument(shape=(b, t, 3 * h * d), dtype=ndx.float32)
    dy_a = ndx.argument(shape=(b, t, h * d), dtype=ndx.float32)
    y, cache = P.causal_attention(qkv_a, h, d)
    model = ndx.build(
        {"qkv": qkv_a, "dy": dy_a}, {"y": y, "dqkv": P.causal_attention_backward(dy_a, cache)}
    )
    _clean(model.graph)
    model = _optimized(model)
    rng = np.random.default_rng(0)
    qkv = rng.standard_normal((b, t, 3 * h * d)).astype(np.float32)
    dy = rng.standard_normal((b, t, h * d)).astype(np.float32)
    feed = {"qkv": qkv, "dy": dy}
    s = session(model, args.threads)

    def numpy_fn() -> Any:
        out, c = P.causal_attention(qkv, h, d)
        return out, P.causal_attention_backward(dy, c)

    want = numpy_fn()
    err = max(float(np.max(np.abs(g - w))) for g, w in zip(s.run(None, feed), want, strict=True))
    line = compare(numpy_fn, {"graph": lambda: s.run(None, feed)}, args)
    return line + f"; largest difference {err:.1e}; nodes {len(model.graph.node)}"


def _timed(s: Any, feed: dict[str, Any], seconds: float = 0.1, rounds: int = 5) -> float:
    """Median seconds of one ``s.run`` over ``rounds`` measurements of about ``seconds``."""
    t = Timed("run", lambda: s.run(None, feed))
    calibrate(t, warmup=3, min_time=seconds)
    return summary([t.measure() for _ in range(rounds)])["median"]


def nodes_case(args: Any) -> str:
    """Where the static train_step graph's time goes, without the profiler's cost per node
    (several microseconds, as much as most nodes take): the graph as onnxruntime optimizes
    it, each node timed alone in a model of its own on its real inputs, less the time of a
    one-``Identity`` model (a run's own cost); summed by operator."""
    import tempfile

    import onnx
    import onnxruntime as ort
    from onnx import helper, numpy_helper

    from microgpt_xp.export import onnx_model

    params, tokens, lengths, state0 = train_setup()
    feed = {"tokens": tokens, "lengths": lengths, **state0}
    exported = onnx_model(params, graph="train_step", batch=tokens.shape[0], time=tokens.shape[1])
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    # extended, not all: the file then holds no layout rewrites for this machine's CPU
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    with tempfile.TemporaryDirectory() as tmp:
        opts.optimized_model_filepath = os.path.join(tmp, "optimized.onnx")
        ort.InferenceSession(exported.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        model = onnx.load(opts.optimized_model_filepath)
    graph = model.graph

    def alone(nodes: list[Any], names: list[str], outputs: list[str]) -> Any:
        def info(name: str) -> Any:
            return helper.make_tensor_value_info(
                name, helper.np_dtype_to_tensor_dtype(values[name].dtype), values[name].shape
            )

        g = helper.make_graph(nodes, "alone", [info(n) for n in names], [info(o) for o in outputs])
        m = helper.make_model(g, opset_imports=model.opset_import, ir_version=model.ir_version)
        return session(m, args.threads)

    every = onnx.ModelProto()
    every.CopyFrom(model)
    declared = {o.name for o in graph.output}
    every.graph.output.extend(
        onnx.ValueInfoProto(name=o) for n in graph.node for o in n.output if o and o not in declared
    )
    whole = session(every, args.threads)
    values = dict(zip([o.name for o in whole.get_outputs()], whole.run(None, feed), strict=True))
    values.update(feed)
    values.update({i.name: numpy_helper.to_array(i) for i in graph.initializer})
    graph_time = _timed(session(model, args.threads), feed)
    values["run_in"] = values["run_out"] = np.zeros(1, np.float32)
    run = alone([helper.make_node("Identity", ["run_in"], ["run_out"])], ["run_in"], ["run_out"])
    base = _timed(run, {"run_in": values["run_in"]})
    by_op: dict[str, float] = {}
    for node in graph.node:
        names = list(dict.fromkeys(n for n in node.input if n))
        outputs = [o for o in node.output if o]
        s = alone([node], names, outputs)
        spent = _timed(s, {n: values[n] for n in names}, seconds=0.05) - base
        by_op[node.op_type] = by_op.get(node.op_type, 0.0) + spent
    total = sum(by_op.values())
    top = sorted(by_op.items(), key=lambda kv: -kv[1])[:8]
    ops = ", ".join(f"{k} {1e6 * v:.0f} us" for k, v in top)
    return (
        f"graph {1e3 * graph_time:.3f} ms, {len(graph.node)} nodes; alone they sum to "
        f"{1e3 * total:.3f} ms (a run's own cost {1e6 * base:.1f} us taken from each); {ops}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.onnx_graphs")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--samples", type=int, default=10_000)
    ap.add_argument("--gen-batch", type=int, default=1_000, help="rows per generate call")
    ap.add_argument("--cases", default="forward,forward-medium,generate,train")
    ap.add_argument("--max-other", type=float, default=0.05)
    ap.add_argument("--gap", type=float, default=0.3, help="idle seconds before a measurement")
    ap.add_argument(
        "--cpu-time",
        action="store_true",
        help="time by this process's CPU time, not the wall clock (loaded machines)",
    )
    args = ap.parse_args()
    threads = set_threads(args.threads)
    print(f"BLAS threads {threads['blas_threads']}, onnxruntime intra-op threads {args.threads}")
    cases = {
        "forward": forward_case,
        "forward-medium": forward_medium_case,
        "generate": generate_case,
        "train": train_case,
        "attention": attention_case,
        "nodes": nodes_case,
    }
    for name in args.cases.split(","):
        print(f"{name}: {cases[name](args)}", flush=True)
    print("load average: " + ", ".join(f"{x:.2f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
