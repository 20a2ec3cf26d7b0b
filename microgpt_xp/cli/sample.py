"""``microgpt-xp sample``: names from a checkpoint (:func:`microgpt_xp.sample`), or with
``--microgpt-exact`` the original's sampling (:mod:`microgpt_xp.cli.replay`)."""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from ..sample import DEFAULT_BATCH_SIZE
from ._common import (
    DEFAULT_NUM_SAMPLES,
    DEFAULT_SEED,
    DEFAULT_TEMPERATURE,
    Subcommands,
    UsageError,
    add_backend_options,
    add_checkpoint_option,
    add_command,
    add_jit_option,
    add_json_option,
    add_threads_option,
    add_workers_option,
    check_device,
    check_jit,
    check_output,
    checkpoint_tokenizer,
    positive_float,
    positive_int,
    print_json,
    print_json_stream,
    print_samples,
)
from ._progress import Progress

if TYPE_CHECKING:
    from ..checkpoint import Checkpoint
    from ..data import Tokenizer


def add_parser(sub: Subcommands) -> None:
    """Add the ``sample`` subcommand to ``sub`` (the result of ``add_subparsers``)."""
    s = add_command(
        sub,
        "sample",
        "sample names from a checkpoint",
        "Sample documents (names) from a trained checkpoint through the KV cache.\n\n"
        "Names are made --batch-size at a time and printed as each batch is done, so any\n"
        "number of them takes the memory of one batch. Sample i depends only on --seed,\n"
        "--temperature, --top-k, --prompt and i: the first N names of a longer run are the\n"
        "names of a run of N, whatever the batch size. On a terminal, a progress bar counts\n"
        "the names of a long run.\n\n"
        "With --microgpt-exact, continue the random state that 'microgpt-xp replay\n"
        "--checkpoint' saved, and print the names that run printed.",
    )
    add_checkpoint_option(s)
    s.add_argument(
        "--num-samples", type=positive_int, default=DEFAULT_NUM_SAMPLES, help="names to sample"
    )
    s.add_argument(
        "--temperature",
        type=positive_float,
        default=DEFAULT_TEMPERATURE,
        help="sampling temperature",
    )
    s.add_argument(
        "--top-k",
        metavar="K",
        type=positive_int,
        default=None,
        help="draw among the K most likely next characters only (default: among all)",
    )
    s.add_argument(
        "--prompt",
        metavar="TEXT",
        default=None,
        help="the start every name continues (printed with it)",
    )
    s.add_argument("--seed", type=int, default=DEFAULT_SEED, help="seed of the sampling draws")
    add_backend_options(s)
    s.add_argument(
        "--batch-size",
        metavar="N",
        type=positive_int,
        default=DEFAULT_BATCH_SIZE,
        help="samples generated at once: memory grows with it, the names do not depend on it",
    )
    add_workers_option(s)
    add_threads_option(s)
    add_jit_option(s)
    s.add_argument(
        "--out",
        metavar="FILE",
        default=None,
        help="write the names to FILE, one per line (a corpus for 'train --data'), through "
        "a temporary file renamed to FILE at the end, so that FILE is complete or "
        "untouched; stdout then gets one summary line (default: the names go to stdout)",
    )
    add_json_option(s)
    s.add_argument(
        "--microgpt-exact",
        action="store_true",
        help="sample as the original does, from the random state saved by "
        "'microgpt-xp replay --checkpoint'",
    )
    s.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Load the checkpoint onto ``--backend``/``--device`` and stream its samples."""
    check_jit(args)
    check_output(args.out, args.checkpoint)
    check_device(args.backend, args.device)
    from ..checkpoint import load
    from ..resources import use_threads

    ck = load(args.checkpoint, backend=args.backend, device=args.device)
    tokenizer = checkpoint_tokenizer(ck, args.checkpoint)
    if args.microgpt_exact:
        batches: Iterable[list[str]] = [_sample_exact(args, ck, tokenizer)]
    else:
        from ..sample import iter_samples

        batches = iter_samples(
            ck.params,
            tokenizer,
            args.num_samples,
            batch_size=args.batch_size,
            temperature=args.temperature,
            top_k=args.top_k,
            prompt=args.prompt,
            seed=args.seed,
            workers=args.workers,
            jit=args.jit,
        )
    head = {
        "checkpoint": args.checkpoint,
        "step": ck.step,
        "temperature": args.temperature,
        "top_k": args.top_k,
        "prompt": args.prompt,
        "seed": None if args.microgpt_exact else args.seed,
        "microgpt_exact": args.microgpt_exact,
    }
    batch = min(args.batch_size, args.num_samples)
    threads = use_threads(args.threads, config=ck.config, batch_size=batch, workload="decode")
    with threads, Progress(args.num_samples, desc="sample", unit="name") as bar:
        counted = _counted(batches, bar)
        if args.out is not None:
            from .._files import atomic_open

            count = 0
            with atomic_open(args.out, make_parents=False) as f:
                for names in counted:
                    f.writelines(f"{name}\n" for name in names)
                    count += len(names)
            if args.json:
                print_json({**head, "out": args.out, "num_samples": count})
            else:
                print(f"wrote {count} names to {args.out}")
        elif args.json:
            print_json_stream(head, "samples", counted)
        else:
            done = 0
            for names in counted:
                print_samples(names, start=done + 1)
                done += len(names)
    return 0


def _counted(batches: Iterable[list[str]], bar: Progress) -> Iterator[list[str]]:
    """The batches, counted on the progress bar as they are taken."""
    done = 0
    for names in batches:
        done += len(names)
        bar.update(done)
        yield names


def _sample_exact(args: argparse.Namespace, ck: Checkpoint, tokenizer: Tokenizer) -> list[str]:
    """``sample --microgpt-exact``: the original's sampling from the saved random state."""
    from .replay import sample_exact

    if (
        args.seed != DEFAULT_SEED
        or args.batch_size != DEFAULT_BATCH_SIZE
        or args.workers is not None
        or args.top_k is not None
        or args.prompt is not None
    ):
        raise UsageError(
            "--seed, --batch-size, --workers, --top-k and --prompt cannot be used with "
            "--microgpt-exact (it continues the saved random state, one name at a time)"
        )
    return sample_exact(args, ck, tokenizer)
