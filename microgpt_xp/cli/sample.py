"""``microgpt-xp sample``: names from a checkpoint (:func:`microgpt_xp.sample`), passages of
text from a text checkpoint (``--length``, streamed as drawn), or with ``--microgpt-exact``
the original's sampling (:mod:`.replay`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Iterator
from typing import Any

from .._files import atomic_open
from ..sample import DEFAULT_BATCH_SIZE, iter_samples
from . import _common as cli
from ._progress import Progress

#: Characters a text checkpoint writes without ``--length``.
DEFAULT_LENGTH = 500


def add_parser(sub: cli.Subcommands) -> None:
    """Add the ``sample`` subcommand to ``sub``."""
    cli.add_command(
        sub,
        "sample",
        "sample names from a checkpoint",
        "Sample documents (names) from a trained checkpoint through the KV cache, --batch-size\n"
        "at a time, each batch printed when done. Sample i depends only on --seed,\n"
        "--temperature, --top-k, --prompt and i, whatever the batch size.\n\n"
        "A text checkpoint ('train --text') writes passages of continuous text instead,\n"
        f"--length characters ({DEFAULT_LENGTH} by default) after --prompt, printed as drawn and\n"
        "separated by a blank line. The context is a window of at most the block size: when\n"
        "full it keeps its last half and reads it again.",
        "checkpoint num_samples/sample temperature top_k prompt seed backend device "
        "batch_size/sample workers threads jit out/sample json microgpt_exact length/sample",
    ).set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Load the checkpoint onto ``--backend``/``--device`` and stream its samples."""
    given = (args.seed, args.batch_size, args.workers, args.top_k, args.prompt, args.length)
    if args.microgpt_exact and given != (0, DEFAULT_BATCH_SIZE, None, None, None, None):
        raise cli.UsageError(
            "--seed, --batch-size, --workers, --top-k, --prompt and --length cannot be used "
            "with --microgpt-exact (it continues the saved random state, one name at a time)"
        )
    cli.check_common(args)
    cli.check_files(args, args.out)
    ck = cli.load_checkpoint(args)
    if ck.mode == "text":
        return _passages(args, ck)
    if args.length is not None:
        raise cli.UsageError(
            f"--length writes a stream of text, and checkpoint {args.checkpoint!r} was trained "
            "on documents (names): leave --length out, or train with 'train --text FILE'"
        )
    if args.num_samples is None:
        args.num_samples = cli.DEFAULT_NUM_SAMPLES
    if args.microgpt_exact:
        from .replay import sample_exact

        batches: Iterable[list[str]] = [sample_exact(args, ck)]
    else:
        batches = iter_samples(
            ck.params,
            ck.tokenizer,
            args.num_samples,
            **cli.keywords(args, "batch_size temperature top_k prompt seed workers jit"),
        )
    seed = None if args.microgpt_exact else args.seed
    head = _head(args, ck, seed=seed, microgpt_exact=args.microgpt_exact)
    batch = min(args.batch_size, args.num_samples)
    with (
        cli.threads_for(args, ck.config, batch, "decode"),
        Progress(args.num_samples, desc="sample", unit="name") as bar,
    ):
        counted = bar.counted(batches)
        if args.out is not None:
            count = 0
            with atomic_open(args.out, make_parents=False) as f:
                for names in counted:
                    f.writelines(f"{name}\n" for name in names)
                    count += len(names)
            _wrote(args, head, count, "names")
        elif args.json:
            cli.print_json_stream(head, "samples", counted)
        else:
            for names in counted:
                cli.print_samples(names, start=bar.n - len(names) + 1)
    return 0


def _passages(args: argparse.Namespace, ck: Any) -> int:
    """``sample`` on a text checkpoint: ``--num-samples`` passages (default one) of
    ``--length`` characters after the prompt, each piece written as it is drawn."""
    if args.workers is not None:
        raise cli.UsageError("--workers cannot be used with a text checkpoint (one stream)")
    count = 1 if args.num_samples is None else args.num_samples
    length = args.length or DEFAULT_LENGTH
    pieces = iter_samples(
        ck.params,
        ck.tokenizer,
        count,
        length=length,
        **cli.keywords(args, "temperature top_k prompt seed jit"),
    )
    size = len(args.prompt or "") + length

    def passages() -> Iterator[list[str]]:  # whole passages, for a file or JSON
        text = ""
        for piece in pieces:
            text += piece
            if len(text) == size:
                yield [text]
                text = ""

    head = _head(args, ck, length=length)
    with cli.threads_for(args, ck.config, 1, "decode"):
        if args.out is not None:
            with atomic_open(args.out, make_parents=False) as f:
                f.write("\n\n".join(text for [text] in passages()) + "\n")
            _wrote(args, head, count, f"passages of {size} characters")
        elif args.json:
            cli.print_json_stream(head, "samples", passages())
        else:
            written = 0
            for piece in pieces:
                if written and written % size == 0:
                    sys.stdout.write("\n\n")
                sys.stdout.write(piece)
                sys.stdout.flush()
                written += len(piece)
            sys.stdout.write("\n")
    return 0


def _wrote(args: argparse.Namespace, head: dict[str, Any], count: int, what: str) -> None:
    """Say that ``count`` samples (``what``) were written to ``--out``, as JSON or a line."""
    if args.json:
        cli.print_json({**head, "out": args.out, "num_samples": count})
    else:
        print(f"wrote {count} {what} to {args.out}")


def _head(args: argparse.Namespace, ck: Any, **more: Any) -> dict[str, Any]:
    """What ``--json`` says of the run before its samples."""
    head = {"checkpoint": args.checkpoint, "step": ck.step}
    return {**head, **cli.keywords(args, "temperature top_k prompt seed"), **more}
