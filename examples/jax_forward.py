"""The forward pass and the hand-written gradient on JAX arrays, checked against NumPy.

The same weights (float64 by default) are put on NumPy and on JAX; ``forward`` and
``loss_and_grads`` run on each through the Array API, and the script prints the largest
relative difference of the logits, the loss and every gradient. It exits with 1 when a
difference is larger than the dtype's tolerance.

    python examples/jax_forward.py
    python examples/jax_forward.py --dtype float32 --batch-size 64 --device gpu:0
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

try:
    import jax
except ImportError:
    sys.exit("this example needs JAX: pip install 'microgpt-xp[jax]'")

from microgpt_xp import (
    GPTConfig,
    Tokenizer,
    _xp,
    default_docs,
    forward,
    init_params,
    loss_and_grads,
)
from microgpt_xp.data import batch_indices, encode_docs, take_batch


def rel_diff(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| / max(max |b|, tiny): one number per array, 0 for equal arrays."""
    scale = max(float(np.max(np.abs(b))), float(np.finfo(b.dtype).tiny))
    return float(np.max(np.abs(a - b))) / scale


def main(argv: list[str] | None = None) -> int:
    """Run the comparison; returns the exit status."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-size", type=int, default=8, help="documents (default 8)")
    ap.add_argument("--dtype", default="float64", choices=["float32", "float64"])
    ap.add_argument("--device", default=None, help="a JAX device such as cpu or gpu:0")
    ap.add_argument("--n-layer", type=int, default=1)
    ap.add_argument("--n-embd", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    docs = default_docs()
    tok = Tokenizer.from_docs(docs)
    config = GPTConfig(tok.vocab_size, n_layer=args.n_layer, n_embd=args.n_embd)
    tokens, lengths = encode_docs(tok, docs, config.block_size)
    batch = take_batch(tokens, lengths, batch_indices(len(docs), args.batch_size, 0, args.seed))

    ref = init_params(config, seed=args.seed, backend="numpy", dtype=args.dtype)
    params = ref.to("jax", device=args.device)  # the same numbers, now jax.Array
    jtok, jlen = (_xp.asarray(a, "jax", device=args.device) for a in batch)
    print(f"jax {jax.__version__} on {params.device}, {params.dtype}, batch {jtok.shape}")

    logits = forward(params, jtok, jlen)  # a jax.Array: the model never imported jax
    loss, grads = loss_and_grads(params, jtok, jlen)
    ref_logits = forward(ref, *batch)
    ref_loss, ref_grads = loss_and_grads(ref, *batch)

    # compare the real positions only (the logits at padding are meaningless)
    real = np.arange(batch[0].shape[1])[None, :] < batch[1][:, None]
    diffs = {
        "logits": rel_diff(_xp.to_numpy(logits)[real], np.asarray(ref_logits)[real]),
        "loss": rel_diff(_xp.to_numpy(loss)[None], np.asarray(ref_loss)[None]),
    }
    for name, g in grads.arrays().items():
        diffs[f"d{name}"] = rel_diff(_xp.to_numpy(g), np.asarray(getattr(ref_grads, name)))
    tol = 1e-12 if args.dtype == "float64" else 1e-4
    print(f"loss: jax {float(loss):.10f} numpy {float(ref_loss):.10f}")
    for name, d in diffs.items():
        print(f"  {name:<10} max relative difference {d:.2e}")
    worst = max(diffs.values())
    print(f"{'agree' if worst <= tol else 'DISAGREE'}: worst {worst:.2e}, tolerance {tol:g}")
    return 0 if worst <= tol else 1


if __name__ == "__main__":
    sys.exit(main())
