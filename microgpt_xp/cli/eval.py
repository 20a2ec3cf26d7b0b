"""``microgpt-xp eval``: the mean per-document loss of a checkpoint over a corpus, scored
by :func:`microgpt_xp.scoring.score_docs` a chunk at a time (on Dask, one task a chunk)."""

from __future__ import annotations

import argparse

from ._common import (
    Subcommands,
    add_backend_options,
    add_checkpoint_option,
    add_command,
    add_jit_option,
    add_json_option,
    add_scheduler_option,
    add_threads_option,
    check_device,
    check_jit,
    check_scheduler,
    checkpoint_tokenizer,
    dask_client,
    note,
    positive_int,
    print_json,
    read_docs,
)
from ._progress import Progress


def add_parser(sub: Subcommands) -> None:
    """Add the ``eval`` subcommand to ``sub`` (the result of ``add_subparsers``)."""
    e = add_command(
        sub,
        "eval",
        "mean loss of a checkpoint over a corpus",
        "Score every document of a corpus with a checkpoint and print the mean "
        "of the\nper-document losses (mean negative log-likelihood per predicted token).\n"
        "A document longer than the checkpoint's block size reads whole is scored on its\n"
        "first block-size characters (a note says how many are).",
    )
    add_checkpoint_option(e)
    e.add_argument(
        "--data",
        metavar="FILE",
        default=None,
        help="UTF-8 text file, one document per line (default: the embedded corpus)",
    )
    add_backend_options(e)
    add_threads_option(e)
    add_jit_option(e)
    e.add_argument(
        "--chunk-size",
        metavar="N",
        type=positive_int,
        default=None,
        help="documents scored at once; on dask, documents per task (default: the most "
        "whose activations fit the memory budget, and at most the fastest measured size: "
        "39 for a 2-layer 64-channel model, 492 for the spec's)",
    )
    e.add_argument(
        "--memory-budget",
        metavar="MB",
        type=positive_int,
        default=500,
        help="megabytes of activations a chunk may take, when --chunk-size is not given",
    )
    add_scheduler_option(e)
    add_json_option(e)
    e.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Score the corpus (on the ``--scheduler`` cluster if given) and print the mean."""
    check_scheduler(args)
    check_jit(args)
    check_device(args.backend, args.device)
    from .. import _xp
    from ..checkpoint import load
    from ..resources import score_chunk, use_threads
    from ..runners import resolve
    from ..scoring import score_docs

    # --backend dask spells one task per chunk (DaskTasks), the weights on the chunks' backend
    runner, home = resolve(None, args.backend, jit=args.jit)
    # connect first: an unreachable scheduler is reported before any work
    with dask_client(args.scheduler):
        ck = load(
            args.checkpoint, backend=home, device=args.device if home == args.backend else None
        )
        chunk = args.chunk_size or score_chunk(
            ck.config, budget_bytes=args.memory_budget * 10**6, dtype=_xp.dtype_name(ck.params.wte)
        )
        if runner.shards:  # one task per chunk
            runner, _ = resolve(None, args.backend, chunk_size=chunk)
        tokenizer = checkpoint_tokenizer(ck, args.checkpoint)
        docs = read_docs(args.data)
        _note_cut(docs, ck.config.block_size)
        threads = use_threads(args.threads, config=ck.config, batch_size=chunk, workload="score")
        with threads, Progress(len(docs), desc="eval", unit="doc") as bar:

            def progress(done: int, total: int) -> None:
                bar.update(done)

            mean_loss = score_docs(
                ck.params,
                tokenizer,
                docs,
                chunk_size=chunk,
                callback=progress,
                runner=runner,
            ).mean
    if args.json:
        print_json(
            {
                "mean_loss": mean_loss,
                "num_docs": len(docs),
                "checkpoint": args.checkpoint,
                "data": args.data,
                "step": ck.step,
            }
        )
    else:
        print(f"mean loss {mean_loss:.4f} over {len(docs)} documents")
    return 0


def _note_cut(docs: list[str], block_size: int) -> None:
    """Say on stderr how many documents the checkpoint's block size cuts, if any."""
    from ..data import count_cut

    cut = count_cut(docs, block_size)
    if cut:
        note(
            f"{cut} of {len(docs)} documents are longer than the checkpoint's block size "
            f"{block_size} reads whole ({block_size - 1} characters): they are scored on "
            f"their first {block_size} characters"
        )
