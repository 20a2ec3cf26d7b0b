"""``microgpt-xp train``: batched training (:func:`microgpt_xp.train`), held-out loss,
progress, then sampling. ``train --microgpt-exact`` is the replay (:mod:`.replay`)."""

from __future__ import annotations

import argparse
import importlib
import shlex
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import _common as cli
from ._progress import Progress


def add_parser(sub: cli.Subcommands) -> None:
    """Add the ``train`` subcommand to ``sub``."""
    t = cli.add_command(
        sub,
        "train",
        "train on a data file or the embedded default corpus, then sample names",
        "Train microgpt with batched Adam and print sampled names.\n\n"
        "The model's shape (--n-layer, --n-embd, --n-head, --block-size) is stored in the\n"
        "checkpoint, where sample, eval and export read it. With --val-data or --val-fraction,\n"
        "the held-out loss is shown beside the training loss: on a terminal in a progress\n"
        "bar, elsewhere in a line written every so often.\n\n"
        "An existing --checkpoint is continued with --resume or replaced with --overwrite,\n"
        "never otherwise, and two runs never write one checkpoint at once. Ctrl-C (or\n"
        "SIGTERM, SIGHUP) stops training and prints the command that continues the run.",
    )
    cli.add(t, "backend device dtype steps batch_size lr data")
    cli.add(t.add_mutually_exclusive_group(), "val_data val_fraction")
    cli.add(
        t, "eval_every seed checkpoint/save checkpoint_every resume overwrite chunk_size workers"
    )
    cli.add(
        t,
        "threads jit scheduler verbose n_layer n_embd n_head block_size plot num_samples temperature",
    )
    cli.add(t, "json microgpt_exact newlines")
    t.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Check what can fail before training, then train (on ``--scheduler`` if given)."""
    if args.microgpt_exact:
        from . import replay

        return replay.run(replay.parse_train_argv(args.argv[1:]))
    if args.newlines:
        raise cli.UsageError("--newlines applies only with --microgpt-exact")
    if args.resume and args.overwrite:
        raise cli.UsageError(
            "--resume continues the run in --checkpoint and --overwrite replaces it: give one"
        )
    if (args.resume or args.overwrite or args.checkpoint_every) and args.checkpoint is None:
        raise cli.UsageError("--resume, --overwrite and --checkpoint-every need --checkpoint PATH")
    if args.eval_every is not None and args.val_data is None and args.val_fraction is None:
        raise cli.UsageError(
            "--eval-every scores held-out documents: give --val-data or --val-fraction"
        )
    cli.check_common(args)
    from .._xp import entry

    if args.chunk_size is not None and not entry(args.backend).chunked:
        raise ValueError("--chunk-size is the rows of a Dask task: it needs --backend dask")
    cli.check_plot(args.plot)
    cli.check_files(args)
    exists = args.checkpoint is not None and Path(args.checkpoint).exists()
    if exists and not (args.resume or args.overwrite):
        raise FileExistsError(
            f"checkpoint {args.checkpoint!r} exists: continue its run with --resume or "
            "replace it with --overwrite"
        )
    with cli.dask_client(args):
        return _train(args, exists and args.resume)


def _corpora(args: argparse.Namespace) -> tuple[list[str], list[str] | None]:
    """The training documents and the held-out ones (``None``: none)."""
    from ..data import split_docs

    docs = cli.read_docs(args.data)
    if args.val_data is not None:
        return docs, cli.read_docs(args.val_data)
    if args.val_fraction is not None:
        return split_docs(docs, args.val_fraction, args.seed)
    return docs, None


def _train(args: argparse.Namespace, resuming: bool) -> int:
    """Batched training, inside the scheduler."""
    sampling = importlib.import_module("microgpt_xp.sample")  # the modules, read at the call
    training = importlib.import_module("microgpt_xp.train")
    from ..cluster import ClusterError
    from ..config import GPTConfig
    from ..data import Tokenizer, default_block_size
    from ..runners import WorkerDied

    docs, val_docs = _corpora(args)
    every_doc = docs if val_docs is None else [*docs, *val_docs]
    tokenizer = Tokenizer.from_docs(every_doc)
    if resuming:  # the checkpoint's shape, read here once (train() reads its run)
        from ..checkpoint import load

        config = _resumed_config(args, load(args.checkpoint), tokenizer)
    else:
        config = GPTConfig(
            tokenizer.vocab_size,
            **cli.shape_of(args, default_block_size(every_doc), tokenizer.vocab_size),
        )
    if len(docs) < args.batch_size:
        raise ValueError(
            f"the corpus has {len(docs)} documents, fewer than the batch size "
            f"{args.batch_size}: use --batch-size {len(docs)} (or less), or more documents"
        )
    shape = {name: getattr(config, name) for name in cli.SPEC_SHAPE}
    shape_text = (
        "" if shape == cli.SPEC_SHAPE else f" ({', '.join(f'{k} {v}' for k, v in shape.items())})"
    )
    held = "" if val_docs is None else f" (+{len(val_docs)} held out)"
    header = (
        f"train: {len(docs)} docs{held} | vocab {tokenizer.vocab_size} | {config.num_params} "
        f"params{shape_text} | {args.backend} {args.dtype} | batch {args.batch_size} | "
        f"{args.steps} steps"
    )
    state: dict[str, Any] = {"bar": None, "step": None}

    def begin(step: int) -> Progress:
        """Print the notes and the header once train() has accepted its arguments (so
        that an error is the only line), then show the progress from ``step`` on."""
        size = config.block_size
        what = f"the checkpoint's block size {size}" if resuming else f"--block-size {size}"
        cli.note_cut(every_doc, size, what)
        if args.resume and not resuming:
            cli.note(f"--resume: {args.checkpoint!r} did not exist; the run started at step 0")
        if not args.json:
            print(header, flush=True)
        state["bar"] = Progress(args.steps, desc="train", unit="step", initial=step)
        return state["bar"]  # type: ignore[no-any-return]

    def progress(step: int, loss: float) -> None:
        bar = state["bar"] or begin(step - 1)
        state["step"] = step
        bar.update(step, loss=f"{loss:.4f}")

    def evaluated(step: int, val_loss: float) -> None:
        state["bar"].update(step, val=f"{val_loss:.4f}")

    started, start = time.time_ns(), time.perf_counter()
    try:
        result = training.train(
            docs,
            config=config,
            val_docs=val_docs,
            callback=progress,
            on_eval=evaluated,
            tokenizer=tokenizer,
            threads=_threads(args, config),
            **cli.keywords(args, "steps batch_size seed backend device dtype checkpoint lr jit"),
            **cli.keywords(args, "chunk_size workers eval_every checkpoint_every resume overwrite"),
        )
    except training.ResumeError as exc:
        raise ValueError(resume_words(exc, args)) from None
    except KeyboardInterrupt as exc:  # Ctrl-C, SIGTERM, SIGHUP
        stop = KeyboardInterrupt(_stopped(args, "interrupted", state["step"], started))
        stop.signum = getattr(exc, "signum", None)  # type: ignore[attr-defined]
        raise stop from None
    except (WorkerDied, ClusterError) as exc:  # a lost worker or scheduler: how to go on
        raise training.TrainingError(_stopped(args, str(exc), state["step"], started)) from None
    finally:
        if state["bar"] is not None:
            state["bar"].close()
    seconds = time.perf_counter() - start
    if state["bar"] is None:  # no step to take: the run in the checkpoint was finished
        begin(result.step).close()
        cli.note(
            f"the run in {args.checkpoint!r} has taken all its {result.step} steps; a "
            "larger --steps extends it"
        )
    names = []
    if args.num_samples:
        names = sampling.sample(
            result.params,
            result.tokenizer,
            args.num_samples,
            chunks=args.chunk_size,
            **cli.keywords(args, "temperature seed workers jit"),
        )
    final_loss = result.losses[-1] if result.losses else None
    final_val = result.val_losses[-1][1] if result.val_losses else None
    if args.plot is not None and result.losses:
        title = f"microgpt-xp ({args.backend} {args.dtype}, batch {args.batch_size})"
        cli.plot_losses(args.plot, result.losses, result.start_step, title, result.val_losses)
    elif args.plot is not None:
        cli.note(f"no steps were run, so no loss curve was written to {args.plot!r}")
    if args.json:
        cli.print_json(
            {
                "final_loss": final_loss,
                "final_val_loss": final_val,
                "steps": result.step,
                "steps_run": len(result.losses),
                "start_step": result.start_step,
                "losses": result.losses,
                "val_losses": [list(pair) for pair in result.val_losses],
                "seconds": seconds,
                **cli.keywords(args, "backend dtype batch_size"),
                "num_docs": len(docs),
                "num_val_docs": 0 if val_docs is None else len(val_docs),
                "config": config.to_dict(),
                "checkpoint": args.checkpoint,
                "samples": names,
            }
        )
        return 0
    loss_text = "n/a" if final_loss is None else f"{final_loss:.4f}"
    val_text = "" if final_val is None else f" | held-out loss {final_val:.4f}"
    resumed_at = f" (resumed at step {result.start_step})" if result.start_step else ""
    print(
        f"done: {len(result.losses)} steps{resumed_at} in {seconds:.1f} s | final loss "
        f"{loss_text}{val_text}"
    )
    if args.checkpoint is not None:
        print(f"checkpoint: {args.checkpoint} (step {result.step})")
    if args.plot is not None and result.losses:
        print(f"loss curve: {args.plot}")
    cli.print_samples(names)
    return 0


def _resumed_config(args: argparse.Namespace, ck: Any, tokenizer: Any) -> Any:
    """The shape of the run that --resume continues; a shape option given, or the
    corpus's characters, must match it."""
    for key in cli.SPEC_SHAPE:
        given, saved = getattr(args, key), getattr(ck.config, key)
        if given is not None and given != saved:
            option = cli.OPTIONS[key]
            raise ValueError(
                f"cannot resume {args.checkpoint!r} with {option} {given}: its run has "
                f"{option} {saved}"
            )
    if ck.tokenizer is not None and ck.tokenizer != tokenizer:
        raise ValueError(
            f"cannot resume {args.checkpoint!r} with --data {args.data or '(the embedded corpus)'}"
            ": its run trained on a corpus of other characters"
        )
    return ck.config


def resume_words(exc: Any, args: argparse.Namespace) -> str:
    """A ``ResumeError`` in the command line's words: the option, given and saved."""
    name, option = args.checkpoint, cli.OPTIONS.get(exc.option, exc.option)
    if exc.option in ("docs", "val_docs"):  # the corpus, or its split by --val-fraction
        given = f"--data {args.data or '(the embedded corpus)'}"
        if args.val_fraction is not None:
            given += f" --val-fraction {args.val_fraction}"
        elif args.val_data is not None and exc.option == "val_docs":
            given = f"--val-data {args.val_data}"
        held = "" if exc.option == "docs" else " held-out"
        split = "" if args.val_fraction is None else " or split"
        return (
            f"cannot resume {name!r} with {given}: its run trained on another{held} corpus"
            f"{split} ({exc.saved}, not {exc.given})"
        )
    text = f"cannot resume {name!r} with {option} {exc.given}: its run has {option} {exc.saved}"
    if exc.option == "steps":
        text += " (a finished run is extended by a larger --steps; an unfinished one keeps its own)"
    return text


def _stopped(args: argparse.Namespace, why: str, step: int | None, started_ns: int) -> str:
    """What a stopped run prints: why and where it stopped, the last checkpoint, and the
    command that continues the run (or starts it again)."""
    where = why + ("" if step is None else f" after step {step}")
    if args.checkpoint is None:
        return f"{where}; nothing was saved (with --checkpoint PATH a run can be resumed)"
    path = Path(args.checkpoint)
    if not (path.exists() and (args.resume or path.stat().st_mtime_ns >= started_ns)):
        # no file yet, or the old file that --overwrite has not replaced yet
        every = (
            f" (it is saved every {args.checkpoint_every} steps)"
            if args.checkpoint_every
            else " (--checkpoint-every N saves it every N steps)"
        )
        again = shlex.join([cli.PROG, *args.argv])
        return f"{where}; no checkpoint of this run was saved yet{every}; start again with: {again}"
    try:  # the file this run wrote: which step it holds
        from ..checkpoint import load

        saved = f" (step {load(args.checkpoint).step})"
    except Exception:  # the message must come out whatever the file holds
        saved = ""
    return (
        f"{where}; the last checkpoint is {args.checkpoint}{saved}; continue the run with: "
        f"{resume_command(args.argv)}"
    )


def resume_command(argv: Sequence[str]) -> str:
    """The command line ``argv`` with ``--resume`` instead of ``--overwrite`` (argparse
    also takes unambiguous prefixes, ``--over``)."""

    def is_flag(arg: str, flag: str) -> bool:
        return len(arg) > 3 and flag.startswith(arg)

    kept = [a for a in argv if not is_flag(a, "--overwrite")]
    if not any(is_flag(a, "--resume") for a in kept):
        kept.append("--resume")
    return shlex.join([cli.PROG, *kept])


def _threads(args: argparse.Namespace, config: Any) -> int | str:
    """``--threads`` as ``train(threads=)`` takes it: the count or ``auto`` as given, by
    default the count for the model, the batch and this machine's cores."""
    from ..resources import default_threads

    return args.threads or default_threads(config, args.batch_size)
