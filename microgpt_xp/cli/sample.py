"""``microgpt-xp sample``: names from a checkpoint (:func:`microgpt_xp.sample`), or with
``--microgpt-exact`` the original's sampling (:mod:`.replay`)."""

from __future__ import annotations

import argparse
from collections.abc import Iterable

from ..sample import DEFAULT_BATCH_SIZE
from . import _common as cli
from ._progress import Progress


def add_parser(sub: cli.Subcommands) -> None:
    """Add the ``sample`` subcommand to ``sub``."""
    s = cli.add_command(
        sub,
        "sample",
        "sample names from a checkpoint",
        "Sample documents (names) from a trained checkpoint through the KV cache.\n\n"
        "Names are made --batch-size at a time and printed as each batch is done, so any\n"
        "number of them takes the memory of one batch. Sample i depends only on --seed,\n"
        "--temperature, --top-k, --prompt and i: the first N names of a longer run are the\n"
        "names of a run of N, whatever the batch size. On a terminal, a progress bar counts\n"
        "the names of a long run.",
    )
    cli.add(s, "checkpoint num_samples/sample temperature top_k prompt seed backend device")
    cli.add(s, "batch_size/sample workers threads jit out/sample json microgpt_exact")
    s.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Load the checkpoint onto ``--backend``/``--device`` and stream its samples."""
    given = (args.seed, args.batch_size, args.workers, args.top_k, args.prompt)
    if args.microgpt_exact and given != (0, DEFAULT_BATCH_SIZE, None, None, None):
        raise cli.UsageError(
            "--seed, --batch-size, --workers, --top-k and --prompt cannot be used with "
            "--microgpt-exact (it continues the saved random state, one name at a time)"
        )
    cli.check_common(args)
    cli.check_files(args, args.out)
    ck = cli.load_checkpoint(args, args.backend, args.device)
    if args.microgpt_exact:
        from .replay import sample_exact

        batches: Iterable[list[str]] = [sample_exact(args, ck)]
    else:
        from ..sample import iter_samples

        batches = iter_samples(
            ck.params,
            ck.tokenizer,
            args.num_samples,
            **cli.keywords(args, "batch_size temperature top_k prompt seed workers jit"),
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
    with (
        cli.threads_for(args, ck.config, batch, "decode"),
        Progress(args.num_samples, desc="sample", unit="name") as bar,
    ):
        counted = bar.counted(batches)
        if args.out is not None:
            from .._files import atomic_open

            count = 0
            with atomic_open(args.out, make_parents=False) as f:
                for names in counted:
                    f.writelines(f"{name}\n" for name in names)
                    count += len(names)
            if args.json:
                cli.print_json({**head, "out": args.out, "num_samples": count})
            else:
                print(f"wrote {count} names to {args.out}")
        elif args.json:
            cli.print_json_stream(head, "samples", counted)
        else:
            for names in counted:
                cli.print_samples(names, start=bar.n - len(names) + 1)
    return 0
