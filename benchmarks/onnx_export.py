"""onnxruntime on the exported graphs against NumPy (issue 32's targets), float32:

- the forward graph against ``mx.forward`` at the default model, B=1024, T=16 (target
  >= 2.0x) and at n_layer=4, n_embd=128, block_size=64, B=64, T=64 (target >= 1.5x);
- 10,000 names through the decode graph (``examples/onnx_sample.py``'s sampler, one call
  per position) against ``mx.sample`` on NumPy, after 100 training steps so that the
  names have their usual lengths (the generate graph, ``benchmarks/onnx_graphs.py``, is
  the one with a target: >= 2.0x).

The rounds are :func:`benchmarks.bench.timing.interleave`'s (NumPy and onnxruntime back to
back, the order alternating, rounds in which other processes used the CPUs dropped); the
figure is the median over rounds of NumPy's time over onnxruntime's, with the quartiles
of the per-round ratios and the number of rounds dropped as the noise. onnxruntime runs
as the example sets it up (``load_session``): ``--threads`` intra-op threads, all graph
optimizations, threads that sleep between calls, and with ``--flush-denormals``
denormals flushed to zero (faster exponentials of the decode graph's unwritten cache
slots; onnxruntime then flushes them on this thread for NumPy too). NumPy's BLAS gets
``--threads`` threads. Each line ends with the graph's number of nodes, and the run with
the machine's load average.

    python -m benchmarks.onnx_export [--rounds 15] [--threads N] [--flush-denormals]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import microgpt_xp as mx
from benchmarks.bench.timing import Timed, calibrate, interleave, set_threads, summary
from microgpt_xp.export import export_onnx

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "onnx_sample.py"
BIG = mx.GPTConfig(27, n_layer=4, n_embd=128, block_size=64)


def load_example() -> Any:
    """``examples/onnx_sample.py`` as a module (its session set-up and sampler)."""
    spec = importlib.util.spec_from_file_location("onnx_sample", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def compare(numpy_fn: Callable[[], Any], ort_fn: Callable[[], Any], args: Any) -> str:
    """Interleaved rounds of the two calls; one line of figures."""
    contenders = [Timed("numpy", numpy_fn), Timed("ort", ort_fn)]
    for t in contenders:
        calibrate(t, warmup=2, min_time=0.2)
    rounds = interleave(contenders, args.rounds, max_other=args.max_other)
    use = rounds.use()
    ratio = summary([m["numpy"] / m["ort"] for m in use])
    ms = {name: 1e3 * summary([m[name] for m in use])["median"] for name in ("numpy", "ort")}
    return (
        f"numpy {ms['numpy']:.2f} ms, onnxruntime {ms['ort']:.2f} ms, ratio "
        f"{ratio['median']:.2f}x (quartiles {ratio['q1']:.2f}..{ratio['q3']:.2f}, "
        f"{len(use)} rounds, {rounds.dropped} dropped{'' if rounds.filtered else ', none clean'})"
    )


def nodes(path: Path) -> int:
    """The number of top-level nodes of an ONNX file."""
    import onnx

    return len(onnx.load(path).graph.node)


def forward_case(example: Any, folder: Path, config: mx.GPTConfig, b: int, args: Any) -> str:
    """``mx.forward`` on NumPy against the exported forward graph, full rows ``(b, T)``."""
    params = mx.init_params(config, dtype="float32")
    path = export_onnx(params, folder / f"forward-{config.n_layer}.onnx")
    sess = example.load_session(path, args.threads, flush_denormals=args.flush_denormals)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, config.vocab_size, size=(b, config.block_size))
    lengths = np.full(b, config.block_size)
    feed = {"tokens": tokens, "lengths": lengths}
    want = mx.forward(params, tokens, lengths)
    err = np.max(np.abs(sess.run(None, feed)[0] - want)) / np.max(np.abs(want))
    line = compare(lambda: mx.forward(params, tokens, lengths), lambda: sess.run(None, feed), args)
    return f"{line}; error {err:.1e} of the largest logit; {nodes(path)} nodes"


def sample_case(example: Any, folder: Path, args: Any) -> str:
    """``mx.sample`` on NumPy against the example's sampler on the decode graph."""
    result = mx.train(steps=100, dtype="float32")
    params, tokenizer, n = result.params, result.tokenizer, args.samples
    path = export_onnx(params, folder / "decode.onnx", graph="decode", tokenizer=tokenizer)
    sess = example.load_session(path, args.threads, flush_denormals=args.flush_denormals)
    same = example.sample_names(sess, n, seed=1) == mx.sample(params, tokenizer, n, seed=1)
    line = compare(
        lambda: mx.sample(params, tokenizer, n, seed=1),
        lambda: example.sample_names(sess, n, seed=1),
        args,
    )
    return f"{line}; same names: {same}; {nodes(path)} nodes"


def main() -> None:
    """Run the three cases and print one line each."""
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.onnx_export", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--rounds", type=int, default=15, help="clean rounds wanted per case")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--samples", type=int, default=10_000)
    ap.add_argument("--flush-denormals", action="store_true")
    ap.add_argument("--max-other", type=float, default=0.05, help="CPU share of others")
    args = ap.parse_args()
    example = load_example()
    threads = set_threads(args.threads)
    import ndonnx
    import onnx

    print(
        f"onnxruntime {example.ort.__version__}, ndonnx {ndonnx.__version__}, onnx "
        f"{onnx.__version__}, numpy {np.__version__} (BLAS threads {threads['blas_threads']}); "
        f"{args.threads} threads, flush denormals {args.flush_denormals}; ratio = NumPy time "
        "/ onnxruntime time"
    )
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        cases: list[tuple[str, Callable[[], str]]] = [
            ("forward default B=1024 T=16 (>= 1.5x)",
             lambda: forward_case(example, folder, mx.GPTConfig(27), 1024, args)),
            ("forward L=4 C=128 T=64 B=64 (>= 1.0x)",
             lambda: forward_case(example, folder, BIG, 64, args)),
            (f"sample {args.samples} names (>= 1.0x)",
             lambda: sample_case(example, folder, args)),
        ]  # fmt: skip
        for label, run in cases:
            print(f"{label}: {run()}", flush=True)
    print("load average (1, 5, 15 min): " + ", ".join(f"{x:.2f}" for x in os.getloadavg()))


if __name__ == "__main__":
    main()
