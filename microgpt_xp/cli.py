"""The ``microgpt-xp`` command."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from . import __version__


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``microgpt-xp`` and its subcommands."""
    parser = argparse.ArgumentParser(prog="microgpt-xp", description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train on a data file or the embedded default corpus")
    t.add_argument("--backend", default="numpy")
    t.add_argument("--steps", type=int, default=1000)
    t.add_argument("--batch-size", type=int, default=32)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--data", default=None)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``microgpt-xp`` console script."""
    args = build_parser().parse_args(argv)
    from .data import default_docs, read_docs
    from .sample import sample
    from .train import train

    docs = default_docs() if args.data is None else read_docs(args.data)
    result = train(
        docs, steps=args.steps, batch_size=args.batch_size, backend=args.backend, seed=args.seed
    )
    print(f"final loss {result.losses[-1]:.4f}")
    for i, name in enumerate(sample(result.params, result.tokenizer, 20, seed=args.seed), 1):
        print(f"sample {i:2d}: {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
