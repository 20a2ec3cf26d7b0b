"""``microgpt-xp train``: batched training (:func:`microgpt_xp.train`), held-out loss,
progress, then sampling. ``train --microgpt-exact`` is the replay
(:mod:`microgpt_xp.cli.replay`)."""

from __future__ import annotations

import argparse
import importlib
import shlex
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._xp import DTYPES
from ._common import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_LR,
    DEFAULT_NUM_SAMPLES,
    DEFAULT_SEED,
    DEFAULT_STEPS,
    DEFAULT_TEMPERATURE,
    PROG,
    Subcommands,
    UsageError,
    add_backend_options,
    add_command,
    add_jit_option,
    add_json_option,
    add_scheduler_option,
    add_threads_option,
    add_workers_option,
    check_corpus_kept,
    check_device,
    check_jit,
    check_scheduler,
    dask_client,
    in_option_words,
    nonnegative_int,
    note,
    positive_float,
    positive_int,
    print_json,
    print_samples,
    read_docs,
    resume_words,
)
from ._plot import check_plot, plot_losses
from ._progress import Progress
from ._shape import SHAPE_OPTIONS, SPEC_SHAPE, add_shape_options, note_cut, shape_text

if TYPE_CHECKING:
    from ..checkpoint import Checkpoint
    from ..config import GPTConfig
    from ..data import Tokenizer


def add_parser(sub: Subcommands) -> None:
    """Add the ``train`` subcommand to ``sub`` (the result of ``add_subparsers``)."""
    t = add_command(
        sub,
        "train",
        "train on a data file or the embedded default corpus, then sample names",
        "Train microgpt with batched Adam and print sampled names.\n\n"
        "The model's shape (--n-layer, --n-embd, --n-head, --block-size) is stored in the\n"
        "checkpoint; sample, eval and export read it from there. By default the block size\n"
        "is the spec's 16, or the longest document + 1 where that is more, so that no\n"
        "document is cut.\n\n"
        "With --val-data or --val-fraction, held-out documents are scored every\n"
        "--eval-every steps (their mean loss, as 'eval' gives it) beside the training loss.\n"
        "On a terminal a progress bar shows both; elsewhere a line is written every so often.\n\n"
        "An existing --checkpoint is continued with --resume (a finished run is extended by\n"
        "a larger --steps) or replaced with --overwrite; it is never overwritten otherwise,\n"
        "and two runs never write one checkpoint at once. Ctrl-C (or SIGTERM, SIGHUP)\n"
        "stops training and prints the command that continues the run.\n\n"
        "With --microgpt-exact, replay the original microgpt script instead (the same as\n"
        "'microgpt-xp replay', whose options it takes).",
    )
    add_backend_options(t)
    t.add_argument(
        "--dtype", choices=DTYPES, default="float32", help="floating dtype of the weights"
    )
    t.add_argument(
        "--steps",
        type=positive_int,
        default=DEFAULT_STEPS,
        help="number of Adam steps (also the length of the linear learning-rate decay); "
        "with --resume, more steps than a finished run took extend it",
    )
    t.add_argument(
        "--batch-size", type=positive_int, default=DEFAULT_BATCH_SIZE, help="documents per step"
    )
    t.add_argument("--lr", type=positive_float, default=DEFAULT_LR, help="initial learning rate")
    t.add_argument(
        "--data",
        metavar="FILE",
        default=None,
        help="UTF-8 text file, one document per line (default: the embedded corpus of "
        "English first names)",
    )
    held = t.add_mutually_exclusive_group()
    held.add_argument(
        "--val-data", metavar="FILE", default=None, help="held-out documents, one a line"
    )
    held.add_argument(
        "--val-fraction",
        metavar="F",
        type=positive_float,
        default=None,
        help="hold out this fraction of --data (a split fixed by --seed; a resumed run keeps it)",
    )
    t.add_argument(
        "--eval-every",
        metavar="N",
        type=positive_int,
        default=None,
        help="score the held-out documents every N steps, and after the last (default: a "
        "tenth of the run)",
    )
    t.add_argument(
        "--seed",
        type=int,
        default=DEFAULT_SEED,
        help="seed of the initial weights, batch order and sampling",
    )
    t.add_argument(
        "--checkpoint",
        metavar="PATH",
        default=None,
        help="save the weights, optimizer state, model shape, tokenizer and loss history "
        "here at the end (and every --checkpoint-every steps); an existing file needs "
        "--resume or --overwrite (default: no checkpoint)",
    )
    t.add_argument(
        "--checkpoint-every",
        metavar="N",
        type=nonnegative_int,
        default=0,
        help="also save the checkpoint every N steps; 0: only at the end",
    )
    t.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --checkpoint if that file exists (with its --data, "
        "held-out documents, --seed, --batch-size, --lr, --dtype and model shape; its "
        "--steps, or more to extend a finished run)",
    )
    t.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing --checkpoint file with a new run",
    )
    t.add_argument(
        "--chunk-size",
        metavar="N",
        type=positive_int,
        default=None,
        help="dask: documents per task (default: one task a batch)",
    )
    add_workers_option(t)
    add_threads_option(t)
    add_jit_option(t)
    add_scheduler_option(t)
    add_shape_options(t, "(default: the spec's 16, or the longest document + 1 where that is more)")
    t.add_argument(
        "--plot",
        metavar="FILE",
        default=None,
        help="save the loss curve to FILE (e.g. loss.png; needs matplotlib)",
    )
    t.add_argument(
        "--num-samples",
        type=nonnegative_int,
        default=DEFAULT_NUM_SAMPLES,
        help="names to sample after training (0: none)",
    )
    t.add_argument(
        "--temperature",
        type=positive_float,
        default=DEFAULT_TEMPERATURE,
        help="sampling temperature",
    )
    add_json_option(
        t, "print a JSON summary (the per-step and held-out losses included) instead of text"
    )
    t.add_argument(
        "--microgpt-exact",
        action="store_true",
        help="replay the original microgpt script (see 'microgpt-xp replay --help')",
    )
    t.add_argument(
        "--newlines",
        action="store_true",
        help="with --microgpt-exact: end step lines with a newline instead of '\\r'",
    )
    t.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Check what can fail before training, then train (on the ``--scheduler`` cluster if
    given)."""
    if args.microgpt_exact:
        from . import replay

        return replay.run(replay.parse_train_argv(args.argv[1:]))
    if args.newlines:
        raise UsageError("--newlines applies only with --microgpt-exact")
    if args.resume and args.overwrite:
        raise UsageError(
            "--resume continues the run in --checkpoint and --overwrite replaces it: give one"
        )
    if (args.resume or args.overwrite or args.checkpoint_every) and args.checkpoint is None:
        raise UsageError("--resume, --overwrite and --checkpoint-every need --checkpoint PATH")
    check_jit(args)
    check_scheduler(args)
    check_plot(args.plot)
    check_corpus_kept(args, "data", "val_data")
    check_device(args.backend, args.device)
    with dask_client(args.scheduler):
        return _train(args)


def _corpora(args: argparse.Namespace) -> tuple[list[str], list[str] | None]:
    """The training documents and the held-out ones (``None``: none)."""
    from ..data import split_docs

    docs = read_docs(args.data)
    if args.val_data is not None:
        return docs, read_docs(args.val_data)
    if args.val_fraction is not None:
        return split_docs(docs, args.val_fraction, args.seed)
    return docs, None


def _train(args: argparse.Namespace) -> int:
    """Batched training, inside the scheduler."""
    # the modules (the package's names are their functions), read at the call
    sampling = importlib.import_module("microgpt_xp.sample")
    training = importlib.import_module("microgpt_xp.train")
    from ..data import Tokenizer, default_block_size
    from ..runners import WorkerDied

    docs, val_docs = _corpora(args)
    every_doc = docs if val_docs is None else [*docs, *val_docs]
    tokenizer = Tokenizer.from_docs(every_doc)
    resumed = _checkpoint_to_resume(args)
    config = _config(args, default_block_size(every_doc), tokenizer, resumed)
    header = (
        f"train: {len(docs)} docs{'' if val_docs is None else f' (+{len(val_docs)} held out)'} | "
        f"vocab {tokenizer.vocab_size} | {config.num_params} params{shape_text(config)} | "
        f"{args.backend} {args.dtype} | batch {args.batch_size} | {args.steps} steps"
    )
    state: dict[str, Any] = {"bar": None, "step": None}

    def begin(step: int) -> Progress:
        """Print the notes and the header once train() has accepted its arguments (so
        that an error is the only line), then show the progress from ``step`` on."""
        what = (
            f"the checkpoint's block size {config.block_size}"
            if resumed
            else f"--block-size {config.block_size}"
        )
        note_cut(every_doc, config.block_size, what)
        if args.resume and resumed is None:
            note(f"--resume: {args.checkpoint!r} did not exist; the run started at step 0")
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

    started = time.time_ns()
    start = time.perf_counter()
    try:
        result = training.train(
            docs,
            steps=args.steps,
            batch_size=args.batch_size,
            seed=args.seed,
            config=config,
            backend=args.backend,
            device=args.device,
            dtype=args.dtype,
            checkpoint=args.checkpoint,
            val_docs=val_docs,
            callback=progress,
            tokenizer=tokenizer,
            lr=args.lr,
            chunk_size=args.chunk_size,
            workers=args.workers,
            threads=args.threads,
            jit=args.jit,
            eval_every=args.eval_every,
            on_eval=evaluated,
            checkpoint_every=args.checkpoint_every,
            resume=args.resume,
            overwrite=args.overwrite,
        )
    except training.ResumeError as exc:
        raise ValueError(resume_words(exc, args)) from None
    except KeyboardInterrupt as exc:  # Ctrl-C, SIGTERM, SIGHUP
        stop = KeyboardInterrupt(_stopped(args, "interrupted", state["step"], started))
        stop.signum = getattr(exc, "signum", None)  # type: ignore[attr-defined]
        raise stop from None
    except WorkerDied as exc:
        raise training.TrainingError(_stopped(args, str(exc), state["step"], started)) from None
    finally:
        if state["bar"] is not None:
            state["bar"].close()
    seconds = time.perf_counter() - start
    if state["bar"] is None:  # no step to take: the run in the checkpoint was finished
        begin(result.step).close()
        note(
            f"the run in {args.checkpoint!r} has taken all its {result.step} steps; a larger --steps extends it"
        )
    names = (
        sampling.sample(
            result.params,
            result.tokenizer,
            args.num_samples,
            temperature=args.temperature,
            seed=args.seed,
            chunks=args.chunk_size,
            workers=args.workers,
            jit=args.jit,
        )
        if args.num_samples
        else []
    )
    final_loss = result.losses[-1] if result.losses else None
    final_val = result.val_losses[-1][1] if result.val_losses else None
    if args.plot is not None:
        if result.losses:
            title = f"microgpt-xp ({args.backend} {args.dtype}, batch {args.batch_size})"
            plot_losses(args.plot, result.losses, result.start_step, title, result.val_losses)
        else:
            note(f"no steps were run, so no loss curve was written to {args.plot!r}")
    if args.json:
        print_json(
            {
                "final_loss": final_loss,
                "final_val_loss": final_val,
                "steps": result.step,
                "steps_run": len(result.losses),
                "start_step": result.start_step,
                "losses": result.losses,
                "val_losses": [list(pair) for pair in result.val_losses],
                "seconds": seconds,
                "backend": args.backend,
                "dtype": args.dtype,
                "batch_size": args.batch_size,
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
        f"done: {len(result.losses)} steps{resumed_at} in {seconds:.1f} s | final loss {loss_text}{val_text}"
    )
    if args.checkpoint is not None:
        print(f"checkpoint: {args.checkpoint} (step {result.step})")
    if args.plot is not None and result.losses:
        print(f"loss curve: {args.plot}")
    print_samples(names)
    return 0


def _checkpoint_to_resume(args: argparse.Namespace) -> Checkpoint | None:
    """The checkpoint that --resume continues (``None``: no --resume, or no file yet)."""
    if not args.resume or not Path(args.checkpoint).exists():
        return None
    from ..checkpoint import load

    return load(args.checkpoint)


def _config(
    args: argparse.Namespace, fit: int, tokenizer: Tokenizer, resumed: Checkpoint | None
) -> GPTConfig:
    """The model shape: the resumed checkpoint's (the shape options given must match
    it), else the options', the block size by default ``fit``."""
    from ..config import GPTConfig

    given = {name: getattr(args, name) for name in SPEC_SHAPE}
    if resumed is not None:
        for key, value in given.items():
            saved = getattr(resumed.config, key)
            if value is not None and value != saved:
                option = SHAPE_OPTIONS[key]
                raise ValueError(
                    f"cannot resume {args.checkpoint!r} with {option} {value}: its run has {option} {saved}"
                )
        if resumed.tokenizer is not None and resumed.tokenizer != tokenizer:
            raise ValueError(
                f"cannot resume {args.checkpoint!r} with --data {args.data or '(the embedded corpus)'}: "
                "its run trained on a corpus of other characters"
            )
        return resumed.config
    shape = {k: SPEC_SHAPE[k] if v is None else v for k, v in given.items()}
    if given["block_size"] is None:
        shape["block_size"] = fit
    try:
        return GPTConfig(tokenizer.vocab_size, **shape)
    except ValueError as exc:  # a shape the options cannot make
        raise UsageError(in_option_words(str(exc))) from None


def _stopped(args: argparse.Namespace, why: str, step: int | None, started_ns: int) -> str:
    """What a stopped run prints: why and where it stopped, the last checkpoint, and the
    command that continues the run (or starts it again)."""
    where = why + ("" if step is None else f" after step {step}")
    if args.checkpoint is None:
        return f"{where}; nothing was saved (with --checkpoint PATH a run can be resumed)"
    path = Path(args.checkpoint)
    ours = path.exists() and (args.resume or path.stat().st_mtime_ns >= started_ns)
    if not ours:  # no file yet, or the old file that --overwrite has not replaced yet
        every = (
            f" (it is saved every {args.checkpoint_every} steps)"
            if args.checkpoint_every
            else " (--checkpoint-every N saves it every N steps)"
        )
        again = shlex.join([PROG, *args.argv])
        return f"{where}; no checkpoint of this run was saved yet{every}; start again with: {again}"
    try:
        from ..checkpoint import load

        saved = f" (step {load(args.checkpoint).step})"
    except Exception:  # the message must come out whatever the file holds
        saved = ""
    return f"{where}; the last checkpoint is {args.checkpoint}{saved}; continue the run with: {resume_command(args.argv)}"


def resume_command(argv: Sequence[str]) -> str:
    """The command line ``argv`` of ``microgpt-xp`` with ``--resume`` instead of
    ``--overwrite`` (argparse also takes unambiguous prefixes, ``--over``)."""

    def is_flag(arg: str, flag: str) -> bool:
        return len(arg) > 3 and flag.startswith(arg)

    kept = [a for a in argv if not is_flag(a, "--overwrite")]
    if not any(is_flag(a, "--resume") for a in kept):
        kept.append("--resume")
    return shlex.join([PROG, *kept])
