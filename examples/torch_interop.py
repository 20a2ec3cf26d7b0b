"""Train microgpt on PyTorch tensors through the Array API, then hand the weights to NumPy
and to the original microgpt's state-dict layout.

The model code is the same as on NumPy: ``backend="torch"`` only decides where the weights
are created, and every later array follows them (``torch.Tensor`` in, ``torch.Tensor`` out).

    python examples/torch_interop.py                    # CPU, small and quick
    python examples/torch_interop.py --device cuda:0 --steps 500 --out weights.json
"""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np

try:
    import torch
except ImportError:
    sys.exit("this example needs PyTorch: pip install 'microgpt-xp[torch]'")

from microgpt_xp import Params, default_docs, forward, sample, train
from microgpt_xp.exact import export_state_dict


def main(argv: list[str] | None = None) -> int:
    """Run the example; returns the exit status (1 if the NumPy copy disagrees)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=50, help="Adam steps (default 50)")
    ap.add_argument("--batch-size", type=int, default=16, help="documents per step (default 16)")
    ap.add_argument("--device", default="cpu", help="a torch device: cpu, cuda:0, mps, ...")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--samples", type=int, default=5, help="names to sample (default 5)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="write the original-layout weights as JSON here")
    args = ap.parse_args(argv)

    # 1. Train on PyTorch: the weights, gradients and Adam moments are torch tensors.
    docs = default_docs()
    result = train(
        docs,
        steps=args.steps,
        batch_size=args.batch_size,
        backend="torch",
        device=args.device,
        dtype=args.dtype,
        seed=args.seed,
    )
    params = result.params
    print(
        f"trained {result.step} steps on {params.backend} {params.device} {params.dtype}: "
        f"loss {result.losses[0]:.4f} -> {result.losses[-1]:.4f}"
    )
    print(f"params.wte is a {type(params.wte).__module__}.{type(params.wte).__name__}")

    # 2. The functions take torch tensors directly and return torch tensors.
    tok = result.tokenizer
    ids = torch.tensor([tok.encode_doc("emma")], device=params.device)
    logits = forward(params, ids)
    print(f"forward(torch {tuple(ids.shape)}) -> {type(logits).__name__} {tuple(logits.shape)}")

    # 3. To NumPy: the same weights on the host; the forward pass agrees to rounding.
    on_numpy = params.to("numpy")
    logits_np = forward(on_numpy, ids.cpu().numpy())
    diff = float(np.max(np.abs(logits_np - logits.detach().cpu().numpy())))
    tol = 1e-4 if args.dtype == "float32" else 1e-10
    print(f"numpy copy: max |logits difference| = {diff:.2e} (tolerance {tol:g})")

    # 4. The original microgpt's layout: "wte", ..., "layer0.mlp_fc2", [n_out][n_in] matrices.
    state = params.to_state_dict()  # name -> NumPy array
    print("state dict:", ", ".join(f"{k} {tuple(v.shape)}" for k, v in state.items()))
    as_torch = {k: torch.from_numpy(v) for k, v in state.items()}  # e.g. for torch.save
    back = Params.from_state_dict(as_torch, config=params.config, backend="torch")
    same = all(
        torch.equal(a, b)
        for a, b in zip(
            back.arrays().values(), params.to("torch", device="cpu").arrays().values(), strict=True
        )
    )
    print(f"state dict -> Params round trip exact: {same}")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(export_state_dict(params), f)  # nested lists of Python floats
        print(f"wrote {args.out}")

    for i, name in enumerate(sample(params, tok, args.samples, seed=args.seed), start=1):
        print(f"sample {i:2d}: {name}")
    return 0 if diff <= tol and same else 1


if __name__ == "__main__":
    sys.exit(main())
