"""``microgpt-xp replay`` (also ``train --microgpt-exact``, parsed by this module's own
parser, so that an option of batched training there is a usage error): the original
script's run (:func:`microgpt_xp.run_exact`), and ``sample --microgpt-exact``, which
continues the random state it saved (:func:`microgpt_xp.sample_exact`)."""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import _common as cli

FLAG = "--microgpt-exact"  # the flag of train that hands its command line to this module
NAMES = "backend device data steps num_samples temperature checkpoint/save overwrite plot json "
NAMES += "newlines n_layer n_embd n_head block_size"  # the replay's options


def add_parser(sub: cli.Subcommands) -> None:
    """Add the ``replay`` subcommand to ``sub``."""
    cli.add_command(
        sub,
        "replay",
        "replay the original microgpt script (also: train --microgpt-exact)",
        "Replay the original microgpt script: Python's random seeded with 42, one document\n"
        "a step in float64, the same printed output. Also spelled 'train --microgpt-exact'.",
        NAMES,
    ).set_defaults(handler=run)


def parse_train_argv(argv: Sequence[str]) -> argparse.Namespace:
    """The replay's arguments from ``train ... --microgpt-exact ...`` (without ``train``)."""
    parser = cli.Parser(prog=f"{cli.PROG} train {FLAG}", description=__doc__)
    cli.add(parser, NAMES)
    args = parser.parse_args([a for a in argv if a != FLAG])
    args.argv = ["train", *argv]
    return args


def run(args: argparse.Namespace) -> int:
    """Replay the original run, printing what the original prints, then save, plot and
    summarize."""
    from .._files import claim
    from ..exact import run_exact

    cli.check_needs(args, "overwrite")
    cli.check_plot(args.plot)
    cli.check_files(args)
    if args.checkpoint is not None and Path(args.checkpoint).exists() and not args.overwrite:
        raise FileExistsError(f"checkpoint {args.checkpoint!r} exists: replace it with --overwrite")
    cli.check_common(args)
    shape: dict[str, Any] = cli.shape_of(args)
    docs = cli.read_docs(args.data)
    if args.data is None:
        cli.note(
            f"no --data: using the embedded corpus ({len(docs)} names); the original microgpt "
            "trained on makemore's names.txt"
        )
    size = shape["block_size"]
    what = (
        f"the original's block size {size}" if args.block_size is None else f"--block-size {size}"
    )
    cli.note_cut(docs, size, what)
    # held from here to the save: of two replays on one path only one starts
    owned = (
        claim(args.checkpoint, exist_ok=args.overwrite)
        if args.checkpoint is not None
        else contextlib.nullcontext()
    )
    with owned:
        start = time.perf_counter()
        replay = run_exact(
            docs,
            num_steps=args.steps,
            **cli.keywords(args, "backend device num_samples temperature newlines"),
            **shape,
            **({"print_fn": None} if args.json else {}),  # type: ignore[arg-type]
        )
        seconds = time.perf_counter() - start
        assert replay.params is not None and replay.adam is not None
        if args.checkpoint is not None:
            from ..checkpoint import save

            version, internal, gauss_next = replay.sample_rng_state
            rng = {"sample_rng_state": [version, list(internal), gauss_next]}
            save(
                args.checkpoint,
                replay.params,
                adam=replay.adam,
                step=len(replay.losses),
                tokenizer=replay.tokenizer,
                meta={"microgpt_exact": rng},
            )
    if args.plot is not None:
        cli.plot_losses(
            args.plot, replay.losses, 0, "microgpt-exact (one document a step, float64)"
        )
    if args.json:
        cli.print_json(
            {
                "mode": "microgpt-exact",
                "final_loss": replay.losses[-1] if replay.losses else None,
                "losses": replay.losses,
                "steps": len(replay.losses),
                "seconds": seconds,
                "num_docs": len(docs),
                "vocab_size": replay.params.config.vocab_size,
                "num_params": replay.params.config.num_params,
                "checkpoint": args.checkpoint,
                "samples": replay.samples,
            }
        )
    return 0


def sample_exact(args: argparse.Namespace, ck: Any) -> list[str]:
    """``sample --microgpt-exact``: the original's sampling from the saved random state."""
    import random

    from ..checkpoint import CheckpointError
    from ..exact import sample_exact

    exact = ck.meta.get("microgpt_exact") if isinstance(ck.meta, dict) else None
    state = exact.get("sample_rng_state") if isinstance(exact, dict) else None
    if state is None:
        raise CheckpointError(
            f"checkpoint {args.checkpoint!r} holds no microgpt-exact random state; "
            "write one with 'microgpt-xp replay --checkpoint PATH'"
        )
    rng = random.Random()
    try:
        version, internal, gauss_next = state
        rng.setstate((version, tuple(internal), gauss_next))
    except (TypeError, ValueError) as exc:
        raise CheckpointError(
            f"checkpoint {args.checkpoint!r}: malformed microgpt-exact random state ({exc})"
        ) from exc
    return sample_exact(ck.params, ck.tokenizer, rng, args.num_samples, args.temperature)
