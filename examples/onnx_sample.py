"""Sample names with onnxruntime alone, from the decode graph that
``microgpt_xp.export_onnx(params, path, graph="decode", tokenizer=tokenizer)`` writes.

    python examples/onnx_sample.py                        # train briefly, export, sample
    python examples/onnx_sample.py --checkpoint ck.npz    # export a checkpoint, sample
    python examples/onnx_sample.py --model names.onnx     # sample from an exported file

Sampling (:func:`sample_names` and what it calls) needs NumPy and onnxruntime only: the
model file carries the weights, and its metadata the characters (``microgpt_xp.tokenizer``,
``{"chars": ...}`` in JSON; BOS is ``len(chars)``). It draws exactly as
``microgpt_xp.sample`` documents: sample ``i`` uses row ``i`` of
``numpy.random.default_rng(seed).random((N, block_size))`` (cast to the model's dtype),
one uniform per position; each position draws by inverse CDF over ``softmax(logits /
temperature)``, the first id whose running sum of ``exp(z - max z)`` exceeds ``u`` times
the total; a name ends at the first BOS or after ``block_size`` characters. (Below a
temperature of ``1e4 / finfo(dtype).max`` the draw is among the largest logits, as in
``microgpt_xp.sample``.)

So the names are ``microgpt_xp.sample(params, tokenizer, N, temperature=..., seed=...)``'s.
They are computed apart (onnxruntime's kernels against NumPy's), so the logits agree to
rounding, not bitwise, and a draw can differ where a uniform falls within that rounding
of a running-sum boundary; only the name of that draw then differs. In float64
(rounding about 1e-16 of the total) this does not happen in practice; in float32 (about
1e-7) it is rare: the 10,000 names of ``benchmarks/onnx_export.py`` come out the same.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

#: ``microgpt_xp.sample``'s bound on the logits: below a temperature of ``LOGIT_BOUND /
#: finfo(dtype).max`` it takes the largest logit instead of dividing by the temperature.
LOGIT_BOUND = 1e4


def load_session(
    path: str | os.PathLike[str], threads: int | None = None, *, flush_denormals: bool = False
) -> Any:
    """An onnxruntime session on the CPU for an exported model: ``threads`` intra-op
    threads (default: this process's CPUs), all graph optimizations, and threads that
    sleep between calls (spinning, they would take the CPUs from the NumPy work between
    two steps).

    ``flush_denormals=True`` makes the decode graph's exponentials of the scores of cache
    slots not written yet (``-inf``) several times faster: onnxruntime's ``exp`` of an
    input below about -87 (a result below float32's normal range) is about 12 times
    slower than of other inputs unless denormals are flushed to zero. (The forward
    graph's attention takes no such exponential.) But onnxruntime then sets flush-to-zero
    on the calling thread for the rest of the process, so NumPy's results below 1.2e-38
    (float32) or 2.2e-308 (float64) become zero too."""
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads or len(os.sched_getaffinity(0))
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if flush_denormals:
        opts.add_session_config_entry("session.set_denormal_as_zero", "1")
    return ort.InferenceSession(os.fspath(path), opts, providers=["CPUExecutionProvider"])


def vocabulary(session: Any) -> list[str]:
    """The characters stored in the model's metadata (id ``i`` is ``chars[i]``)."""
    meta = session.get_modelmeta().custom_metadata_map
    if "microgpt_xp.tokenizer" not in meta:
        raise ValueError("the model holds no tokenizer (export it with tokenizer=...)")
    return list(json.loads(meta["microgpt_xp.tokenizer"])["chars"])


def draw(logits: np.ndarray, u: np.ndarray, temperature: float) -> np.ndarray:
    """One id per row of ``logits (B, V)`` by inverse CDF with uniforms ``u (B,)``, in the
    logits' dtype: the number of running sums ``c[0..V-2]`` of ``exp(z - max z)`` that are
    ``<= u * c[V-1]``, ``z = logits / temperature``. Returns ``(B,)`` int64.

    The work runs on a ``(V, B)`` copy of the logits, so that the max, the running sums
    and the count are vectorized passes over the whole batch, one per id (each running sum
    adds the ids in order either way: the same values)."""
    dtype = logits.dtype.type
    z_t = np.ascontiguousarray(logits.T)
    if 1.0 / temperature * LOGIT_BOUND <= float(np.finfo(dtype).max):
        z_t = z_t * dtype(1.0 / temperature)
        weights = np.exp(z_t - z_t.max(axis=0))
    else:  # the limit of a temperature going to 0
        weights = (z_t == z_t.max(axis=0)).astype(dtype)
    c = np.cumsum(weights, axis=0)
    return np.sum(c[:-1] <= u * c[-1], axis=0, dtype=np.int64)


def cache_inputs(session: Any) -> list[Any]:
    """The decode graph's cache inputs (``keys_0``, ..., ``values_0``, ...: one ``(S, C,
    batch)`` buffer per layer and kind), or ``ValueError`` for another graph."""
    caches = [i for i in session.get_inputs() if i.name.startswith(("keys_", "values_"))]
    if not caches:
        raise ValueError("not a decode graph (export it with graph='decode')")
    return caches


def decode_rows(session: Any, bos: int, uniforms: np.ndarray, temperature: float) -> np.ndarray:
    """Generate ``b`` sequences from BOS with ``uniforms (b, block_size)``; returns ``(b,
    block_size)`` int64 ids, each row BOS from its first BOS on.

    Rows that have ended leave the batch (their columns of the caches are dropped) once
    they are a quarter of it or more: each step then runs on the rows still going, and
    the copy that drops them is made rarely. A row's values do not depend on the others."""
    caches = cache_inputs(session)
    block_size, n_embd, _ = caches[0].shape
    dtype = np.float64 if caches[0].type == "tensor(double)" else np.float32
    b = uniforms.shape[0]
    u = uniforms.astype(dtype)
    feed = {
        "token_ids": np.full(b, bos, dtype=np.int64),
        "pos": np.array(0, dtype=np.int64),
        **{i.name: np.zeros((block_size, n_embd, b), dtype=dtype) for i in caches},
    }
    outputs = [o.name for o in session.get_outputs()]
    out = np.full((b, block_size), bos, dtype=np.int64)
    rows = np.arange(b)  # the rows of ``out`` still in the batch, in batch order
    going = np.ones(b, dtype=bool)  # which of them have not ended
    for pos in range(block_size):
        results = dict(zip(outputs, session.run(None, feed), strict=True))
        # each output new_X is the next step's input X (the caches and pos)
        feed.update({k[len("new_") :]: v for k, v in results.items() if k.startswith("new_")})
        token = draw(results["logits"], u[rows, pos], temperature)
        going &= token != bos
        out[rows[going], pos] = token[going]
        feed["token_ids"] = token
        if not going.any():
            break
        if 4 * np.count_nonzero(going) <= 3 * rows.size:
            rows, token = rows[going], token[going]
            for i in caches:
                feed[i.name] = np.ascontiguousarray(feed[i.name][..., going])
            feed["token_ids"], going = token, np.ones(rows.size, dtype=bool)
    return out


def sample_names(
    session: Any,
    num_samples: int,
    *,
    temperature: float = 0.5,
    seed: int = 0,
    batch_size: int = 2000,
) -> list[str]:
    """``num_samples`` names from an exported decode graph, ``batch_size`` at a time (the
    names do not depend on it): ``microgpt_xp.sample``'s names for the same seed and
    temperature (see the module's docstring)."""
    if not (np.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be a positive number, got {temperature!r}")
    chars = vocabulary(session)
    bos = len(chars)
    text = np.array([*chars, ""], dtype=object)  # id -> its text, BOS -> ""
    block_size = cache_inputs(session)[0].shape[0]
    uniforms = np.random.default_rng(seed).random((num_samples, block_size))
    names = []
    for start in range(0, num_samples, batch_size):
        ids = decode_rows(session, bos, uniforms[start : start + batch_size], temperature)
        names += ["".join(row) for row in text[ids].tolist()]
    return names


# -- writing a model (this part uses microgpt_xp) --------------------------------------------
def write_model(path: Path, checkpoint: str | None, steps: int, dtype: str) -> tuple[Any, Any]:
    """Export the decode graph of a checkpoint (or of ``steps`` training steps on the
    embedded names) to ``path``; returns the ``(params, tokenizer)`` exported."""
    import microgpt_xp as mx
    from microgpt_xp.export import export_onnx

    if checkpoint is not None:
        ck = mx.load(checkpoint, dtype=dtype)
        params, tokenizer = ck.params, ck.tokenizer
        if tokenizer is None:
            raise SystemExit(f"{checkpoint} holds no tokenizer")
    else:
        result = mx.train(steps=steps, dtype=dtype)
        params, tokenizer = result.params, result.tokenizer
    export_onnx(params, path, graph="decode", tokenizer=tokenizer)
    return params, tokenizer


def main(argv: list[str] | None = None) -> int:
    """Export (unless ``--model``), sample with onnxruntime and print the names."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="an exported decode graph to sample from")
    ap.add_argument("--checkpoint", help="a microgpt-xp checkpoint to export")
    ap.add_argument("--steps", type=int, default=200, help="training steps without one")
    ap.add_argument("--dtype", choices=("float32", "float64"), default="float64")
    ap.add_argument("--samples", type=int, default=20, help="names to sample (default 20)")
    ap.add_argument("--temperature", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        exported = None
        path = Path(args.model) if args.model else Path(tmp) / "decode.onnx"
        if args.model is None:
            exported = write_model(path, args.checkpoint, args.steps, args.dtype)
            print(f"wrote the decode graph ({path.stat().st_size} bytes)")
        names = sample_names(
            load_session(path), args.samples, temperature=args.temperature, seed=args.seed
        )
    for i, name in enumerate(names, start=1):
        print(f"sample {i:2d}: {name}")
    if exported is not None:
        import microgpt_xp as mx

        same = names == mx.sample(
            *exported, args.samples, temperature=args.temperature, seed=args.seed
        )
        print(f"the names of microgpt_xp.sample: {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
