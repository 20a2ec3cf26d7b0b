"""microgpt_xp on NumPy, step by step: weights, a forward pass, a few training steps written
out by hand, then sampling.

    python examples/numpy_quickstart.py                 # small and quick
    python examples/numpy_quickstart.py --steps 1000 --batch-size 32
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from microgpt_xp import GPTConfig, Tokenizer, default_docs, forward, init_params, loss_and_grads
from microgpt_xp.data import batch_indices, encode_docs, take_batch
from microgpt_xp.optim import Adam
from microgpt_xp.sample import sample


def main(argv: list[str] | None = None) -> int:
    """Run the quickstart; returns the exit status."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=50, help="Adam steps (default 50)")
    ap.add_argument("--batch-size", type=int, default=16, help="documents per step (default 16)")
    ap.add_argument("--samples", type=int, default=5, help="names to sample (default 5)")
    ap.add_argument("--temperature", type=float, default=0.5, help="sampling temperature")
    ap.add_argument("--seed", type=int, default=0, help="weights, batches and sampling")
    args = ap.parse_args(argv)

    # 1. Data: the embedded corpus of first names, the character tokenizer, padded rows.
    docs = default_docs()
    tokenizer = Tokenizer.from_docs(docs)
    config = GPTConfig(vocab_size=tokenizer.vocab_size)  # the spec's 1 layer, 16 channels
    tokens, lengths = encode_docs(tokenizer, docs, config.block_size)
    print(f"{len(docs)} docs, vocab {tokenizer.vocab_size}, {config.num_params} params")

    # 2. Weights: N(0, 0.08^2) from a seeded generator, float32 on NumPy.
    params = init_params(config, seed=args.seed, backend="numpy", dtype="float32")

    # 3. A forward pass over a batch of right-padded documents: (B, T) ids -> (B, T, V) logits.
    idx = np.arange(4)
    batch_tokens, batch_lengths = take_batch(tokens, lengths, idx)
    logits = forward(params, batch_tokens, batch_lengths)
    print(f"forward: tokens {batch_tokens.shape} -> logits {logits.shape}")

    # 4. Training, by hand: the loss and its hand-written gradient, then one Adam step.
    adam = Adam(params, lr=0.01, num_steps=args.steps)
    losses = []
    for step in range(args.steps):
        idx = batch_indices(len(docs), args.batch_size, step, args.seed)
        loss, grads = loss_and_grads(params, *take_batch(tokens, lengths, idx))
        params = adam.step(params, grads)  # a new Params; nothing is modified in place
        losses.append(float(loss))
        if step == 0 or (step + 1) % max(1, args.steps // 5) == 0:
            print(f"step {step + 1:4d} / {args.steps} | loss {losses[-1]:.4f}")

    # 5. Sampling through the KV cache.
    names = sample(params, tokenizer, args.samples, temperature=args.temperature, seed=args.seed)
    for i, name in enumerate(names, start=1):
        print(f"sample {i:2d}: {name}")
    print(f"loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
