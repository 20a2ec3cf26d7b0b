"""Train microgpt on an NVIDIA GPU with CuPy, then sample; compare the first loss with NumPy.

Without CuPy or without a usable CUDA GPU the script prints a line starting with
``skipped: no CUDA GPU`` and exits with 0, so it can run anywhere.

    python examples/cupy_train.py
    python examples/cupy_train.py --steps 1000 --batch-size 1024 --n-embd 128 --n-layer 4
"""

from __future__ import annotations

import argparse
import sys
import time


def cuda_gpu() -> str | None:
    """``None`` when CuPy can use a CUDA GPU, else the reason why not."""
    try:
        import cupy
    except ImportError as exc:
        return f"cupy is not installed ({exc.name}); pip install 'microgpt-xp[cupy]'"
    try:
        if not cupy.cuda.is_available():
            return "cupy.cuda.is_available() is False"
    except Exception as exc:  # a broken driver or runtime raises instead of answering
        return f"CUDA is not usable: {exc}"
    return None


def main(argv: list[str] | None = None) -> int:
    """Run the example; returns the exit status."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=50, help="Adam steps (default 50)")
    ap.add_argument("--batch-size", type=int, default=64, help="documents per step (default 64)")
    ap.add_argument("--n-layer", type=int, default=1)
    ap.add_argument("--n-embd", type=int, default=16)
    ap.add_argument("--device", default=None, help="GPU index or cuda:N (default: current)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--samples", type=int, default=5, help="names to sample (default 5)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    why = cuda_gpu()
    if why is not None:
        print(f"skipped: no CUDA GPU ({why})")
        return 0

    import cupy

    from microgpt_xp import GPTConfig, Tokenizer, default_docs, sample, train

    docs = default_docs()
    tok = Tokenizer.from_docs(docs)
    config = GPTConfig(tok.vocab_size, n_layer=args.n_layer, n_embd=args.n_embd)
    common = dict(batch_size=args.batch_size, dtype=args.dtype, seed=args.seed, config=config)

    start = time.perf_counter()
    result = train(docs, steps=args.steps, backend="cupy", device=args.device, **common)
    cupy.cuda.Device().synchronize()
    seconds = time.perf_counter() - start
    params = result.params
    name = cupy.cuda.runtime.getDeviceProperties(params.device.id)["name"].decode()
    print(f"trained {result.step} steps on {name} ({params.dtype}) in {seconds:.2f} s")
    print(f"loss {result.losses[0]:.4f} -> {result.losses[-1]:.4f}")

    # The first step on NumPy: same seed, so the same weights and batch and the same loss
    # (the loss is taken before the update, so one step is enough).
    first_np = train(docs, steps=1, backend="numpy", **common)
    diff = abs(first_np.losses[0] - result.losses[0])
    tol = 1e-4 if args.dtype == "float32" else 1e-10
    print(
        f"first loss: cupy {result.losses[0]:.6f} numpy {first_np.losses[0]:.6f} (diff {diff:.1e})"
    )

    for i, s in enumerate(sample(params, tok, args.samples, seed=args.seed), start=1):
        print(f"sample {i:2d}: {s}")
    return 0 if diff <= tol else 1


if __name__ == "__main__":
    sys.exit(main())
