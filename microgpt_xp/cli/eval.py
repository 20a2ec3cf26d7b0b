"""``microgpt-xp eval``: the mean per-document loss of a checkpoint over a corpus, scored
by :func:`microgpt_xp.scoring.score_docs` a chunk at a time (on Dask, one task a chunk);
for a checkpoint trained on a stream of text (``train --text``), the loss per token of the
file read as a stream, on the fixed windows of training's held-out scoring."""

from __future__ import annotations

import argparse
from typing import Any

from . import _common as cli
from ._progress import Progress


def add_parser(sub: cli.Subcommands) -> None:
    """Add the ``eval`` subcommand to ``sub``."""
    cli.add_command(
        sub,
        "eval",
        "mean loss of a checkpoint over a corpus",
        "Score every document of a corpus with a checkpoint and print the mean per-document\n"
        "loss and the loss per token; a document longer than the block size reads whole is\n"
        "scored on its first block-size characters (a note says how many are).\n\n"
        "A checkpoint of 'train --text' reads --data as one stream of text and prints its\n"
        "loss per token on windows that cover it, as training scores its held-out text.",
        "checkpoint data backend device threads jit chunk_size/eval memory_budget scheduler "
        "verbose eval_tokens/eval json",
    ).set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Score the corpus (on the ``--scheduler`` cluster if given) and print the mean."""
    cli.check_common(args)
    from .. import _xp
    from ..resources import score_chunk
    from ..runners import pick
    from ..scoring import score_docs

    with cli.dask_client(args):  # connect first: an unreachable scheduler fails now
        ck = cli.load_checkpoint(args)
        budget = args.memory_budget * 10**6
        dtype = _xp.dtype_name(ck.params.wte)
        chunk = args.chunk_size or score_chunk(ck.config, budget_bytes=budget, dtype=dtype)
        # --backend dask: one task per chunk (DaskTasks), placed by the runner
        chunked = _xp.entry(args.backend).chunked
        runner = pick(None, args.backend, chunk_size=chunk if chunked else None, jit=args.jit)
        if ck.mode == "text":
            result, line = _stream(args, ck, runner, chunk)
        else:
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
            result = {"mean_loss": scores.mean, "token_loss": scores.token_mean, "mode": "docs"}
            result["num_docs"] = len(docs)
            line = (
                f"mean loss {scores.mean:.4f} over {len(docs)} documents "
                f"({scores.token_mean:.4f} per token)"
            )
    if args.json:
        cli.print_json({**result, **cli.keywords(args, "checkpoint data"), "step": ck.step})
    else:
        print(line)
    return 0


def _stream(args: argparse.Namespace, ck: Any, runner: Any, chunk: int) -> tuple[dict, str]:
    """Score ``--data`` as one stream of text on the fixed windows of training's held-out
    scoring: what ``--json`` and the text line say of their loss per predicted token."""
    from ..data import held_out_rows
    from ..scoring import score_encoded

    if args.data is None:
        raise cli.UsageError(
            f"{args.checkpoint!r} was trained on a stream of text: give the text to score "
            "with --data FILE"
        )
    text = cli.read_text(args.data)
    tokens, lengths = held_out_rows(
        ck.tokenizer, text, ck.config.block_size, args.eval_tokens or len(text)
    )
    with (
        cli.threads_for(args, ck.config, min(chunk, len(lengths)), "score"),
        Progress(len(lengths), desc="eval", unit="window") as bar,
    ):
        scores = score_encoded(ck.params, tokens, lengths, chunk_size=chunk, runner=runner)
        bar.update(len(lengths))
    predicted = int(lengths.sum()) - len(lengths)
    result = {"mean_loss": scores.token_mean, "token_loss": scores.token_mean, "mode": "text"}
    result |= {"num_chars": len(text), "num_tokens": predicted, "num_windows": len(lengths)}
    line = (
        f"loss {scores.token_mean:.4f} per token over {predicted} predicted characters "
        f"of {len(text)} ({len(lengths)} windows of {lengths[0]})"
    )
    return result, line
