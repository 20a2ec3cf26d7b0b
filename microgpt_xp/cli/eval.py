"""``microgpt-xp eval``: the mean per-document loss of a checkpoint over a corpus, scored
by :func:`microgpt_xp.scoring.score_docs` a chunk at a time (on Dask, one task a chunk)."""

from __future__ import annotations

import argparse

from . import _common as cli
from ._progress import Progress


def add_parser(sub: cli.Subcommands) -> None:
    """Add the ``eval`` subcommand to ``sub``."""
    e = cli.add_command(
        sub,
        "eval",
        "mean loss of a checkpoint over a corpus",
        "Score every document of a corpus with a checkpoint and print the mean of the\n"
        "per-document losses (mean negative log-likelihood per predicted token).\n"
        "A document longer than the checkpoint's block size reads whole is scored on its\n"
        "first block-size characters (a note says how many are).",
    )
    cli.add(e, "checkpoint data backend device threads jit chunk_size/eval memory_budget scheduler")
    cli.add(e, "json")
    e.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Score the corpus (on the ``--scheduler`` cluster if given) and print the mean."""
    cli.check_common(args)
    from .. import _xp
    from ..resources import score_chunk
    from ..runners import pick
    from ..scoring import score_docs

    with cli.dask_client(args.scheduler):  # connect first: an unreachable scheduler fails now
        ck = cli.load_checkpoint(args, args.backend, args.device)
        budget = args.memory_budget * 10**6
        dtype = _xp.dtype_name(ck.params.wte)
        chunk = args.chunk_size or score_chunk(ck.config, budget_bytes=budget, dtype=dtype)
        # --backend dask: one task per chunk (DaskTasks), placed by the runner
        chunked = _xp.entry(args.backend).chunked
        runner = pick(None, args.backend, chunk_size=chunk if chunked else None, jit=args.jit)
        docs = cli.read_docs(args.data)
        size = ck.config.block_size
        cli.note_cut(docs, size, f"the checkpoint's block size {size}", scored=True)
        with (
            cli.threads_for(args, ck.config, chunk, "score"),
            Progress(len(docs), desc="eval", unit="doc") as bar,
        ):
            scores = score_docs(
                ck.params,
                ck.tokenizer,
                docs,
                chunk_size=chunk,
                callback=lambda done, total: bar.update(done),
                runner=runner,
            )
    if args.json:
        cli.print_json(
            {
                "mean_loss": scores.mean,
                "num_docs": len(docs),
                "checkpoint": args.checkpoint,
                "data": args.data,
                "step": ck.step,
            }
        )
    else:
        print(f"mean loss {scores.mean:.4f} over {len(docs)} documents")
    return 0
