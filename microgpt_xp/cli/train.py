"""``microgpt-xp train``: batched training (:func:`microgpt_xp.train`) then sampling, or
with ``--microgpt-exact`` the original script's run (:func:`microgpt_xp.run_exact`)."""

from __future__ import annotations

import argparse
import shlex
import sys
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
    add_workers_option,
    check_device,
    check_jit,
    check_scheduler,
    check_workers,
    dask_client,
    nonnegative_int,
    note,
    positive_float,
    positive_int,
    print_json,
    print_samples,
    read_docs,
)

if TYPE_CHECKING:
    from ..checkpoint import Checkpoint
    from ..config import GPTConfig
    from ..data import Tokenizer
    from ..train import ResumeError

#: The spec's model shape: the defaults of --n-layer, --n-embd, --n-head, and the block
#: size of the embedded corpus and of --microgpt-exact.
SPEC_SHAPE = {"n_layer": 1, "n_embd": 16, "n_head": 4, "block_size": 16}
SHAPE_OPTIONS = {name: "--" + name.replace("_", "-") for name in SPEC_SHAPE}
#: The CLI option of each train() argument a ResumeError can name.
RESUME_OPTIONS = {
    "seed": "--seed",
    "batch_size": "--batch-size",
    "lr": "--lr",
    "dtype": "--dtype",
    "steps": "--steps",
    "docs": "--data",
}


def add_parser(sub: Subcommands) -> None:
    """Add the ``train`` subcommand to ``sub`` (the result of ``add_subparsers``)."""
    t = add_command(
        sub,
        "train",
        "train on a data file or the embedded default corpus, then sample names",
        "Train microgpt with batched Adam and print sampled names.\n\n"
        "The model's shape (--n-layer, --n-embd, --n-head, --block-size) is stored in the\n"
        "checkpoint; sample, eval and export read it from there. By default the block size\n"
        "fits the longest document of --data, so that no document is cut.\n\n"
        "An existing --checkpoint is continued with --resume (a finished run is extended by\n"
        "a larger --steps) or replaced with --overwrite; it is never overwritten otherwise.\n"
        "Ctrl-C stops training and prints the command that continues the run.\n\n"
        "With --microgpt-exact, replay the original microgpt script instead: Python's\n"
        "random seeded with 42, one document per step in float64, the same printed output.\n"
        "--steps, --num-samples, --temperature, --backend, --device, --data, --checkpoint,\n"
        "--overwrite, --plot, --json and the model's shape apply in that mode too; the\n"
        "other training options do not.",
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
        help="save the weights, optimizer state, model shape and tokenizer here at the end "
        "(and every --checkpoint-every steps); an existing file needs --resume or "
        "--overwrite (default: no checkpoint)",
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
        "--seed, --batch-size, --lr, --dtype and model shape; its --steps, or more to "
        "extend a finished run: the learning rate then decays as in a run of the new "
        "length, lr * (1 - step / steps))",
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
        help="dask: documents per chunk of the batch axis (default: one chunk)",
    )
    add_workers_option(t)
    add_jit_option(t)
    add_scheduler_option(t)
    _add_shape_options(t)
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
    add_json_option(t, "print a JSON summary instead of text")
    t.add_argument(
        "--microgpt-exact",
        action="store_true",
        help="replay the original microgpt script (its seed, order, float64 and output)",
    )
    t.add_argument(
        "--newlines",
        action="store_true",
        help="with --microgpt-exact: end step lines with a newline instead of '\\r'",
    )
    t.set_defaults(handler=run)


def _add_shape_options(t: argparse.ArgumentParser) -> None:
    """--n-layer, --n-embd, --n-head and --block-size, in a group of their own."""
    shape = t.add_argument_group(
        "model shape",
        "Stored in the checkpoint; sample, eval and export read it from there. With\n"
        "--resume, the checkpoint's shape is used (an option given must match it).",
    )
    shape.add_argument(
        "--n-layer",
        metavar="N",
        type=positive_int,
        default=None,
        help=f"transformer blocks (default: {SPEC_SHAPE['n_layer']})",
    )
    shape.add_argument(
        "--n-embd",
        metavar="N",
        type=positive_int,
        default=None,
        help="channels of the residual stream, a multiple of --n-head "
        f"(default: {SPEC_SHAPE['n_embd']})",
    )
    shape.add_argument(
        "--n-head",
        metavar="N",
        type=positive_int,
        default=None,
        help=f"attention heads (default: {SPEC_SHAPE['n_head']})",
    )
    shape.add_argument(
        "--block-size",
        metavar="N",
        type=positive_int,
        default=None,
        help="positions the model reads: a document of up to N-1 characters is read "
        "whole; longer ones are cut to their first N characters, and a note says how "
        "many (default: the longest document of --data + 1; "
        f"{SPEC_SHAPE['block_size']} for the embedded corpus and with --microgpt-exact)",
    )


def run(args: argparse.Namespace) -> int:
    """Check the options, then train (on the ``--scheduler`` cluster if given)."""
    if args.resume and args.overwrite:
        raise UsageError(
            "--resume continues the run in --checkpoint and --overwrite replaces it: give one"
        )
    _check_shape(args)
    if args.microgpt_exact:
        return _run_exact(args)
    if args.newlines:
        raise UsageError("--newlines applies only with --microgpt-exact")
    if (args.resume or args.overwrite or args.checkpoint_every) and args.checkpoint is None:
        raise UsageError("--resume, --overwrite and --checkpoint-every need --checkpoint PATH")
    if args.chunk_size is not None and args.backend != "dask":
        raise UsageError("--chunk-size applies only with --backend dask")
    check_workers(args)
    check_jit(args)
    check_scheduler(args)
    _check_plot(args.plot)
    _check_checkpoint_free(args)
    check_device(args.backend, args.device)
    with dask_client(args.scheduler):
        return _train(args)


def _check_shape(args: argparse.Namespace) -> None:
    """Refuse an --n-embd that --n-head does not divide (each head takes ``n_embd /
    n_head`` channels); with --resume the checkpoint's shape is checked instead."""
    n_embd = SPEC_SHAPE["n_embd"] if args.n_embd is None else args.n_embd
    n_head = SPEC_SHAPE["n_head"] if args.n_head is None else args.n_head
    if n_embd % n_head and not args.resume:
        raise UsageError(
            f"--n-embd {n_embd} is not a multiple of --n-head {n_head} (each head takes "
            "n_embd / n_head channels)"
        )


def _check_checkpoint_free(args: argparse.Namespace) -> None:
    """Refuse to write over an existing --checkpoint without --resume or --overwrite."""
    exists = args.checkpoint is not None and Path(args.checkpoint).exists()
    if exists and not (args.resume or args.overwrite):
        raise FileExistsError(
            f"checkpoint {args.checkpoint!r} exists: continue its run with --resume, "
            "or replace it with --overwrite"
        )


def _train(args: argparse.Namespace) -> int:
    """Batched training (``train`` without ``--microgpt-exact``), inside the scheduler."""
    docs = read_docs(args.data)
    if len(docs) < args.batch_size:
        from ..data import DataError

        raise DataError(
            f"{_corpus_name(args)} has {len(docs)} documents, fewer than the batch size "
            f"{args.batch_size}: use --batch-size {len(docs)} (or less), or more documents"
        )

    from tqdm import tqdm

    from ..data import Tokenizer
    from ..sample import sample
    from ..train import ResumeError, train

    tokenizer = Tokenizer.from_docs(docs)
    resumed = _checkpoint_to_resume(args)
    config = _config(args, docs, tokenizer, resumed)
    header = (
        f"train: {len(docs)} docs | vocab {tokenizer.vocab_size} | "
        f"{config.num_params} params{_shape_text(config)} | {args.backend} "
        f"{args.dtype} | batch {args.batch_size} | {args.steps} steps"
    )
    bar: Any = None

    def begin(step: int) -> None:
        """Print the notes and the header once train() has accepted its arguments (so
        that an error is the only line), then show the progress bar from ``step`` on."""
        nonlocal bar
        size = config.block_size
        what = f"the checkpoint's block size {size}" if resumed else f"--block-size {size}"
        _note_cut(docs, size, what)
        if args.resume and resumed is None:
            note(f"--resume: {args.checkpoint!r} did not exist; the run started at step 0")
        if not args.json:
            print(header, flush=True)
        bar = tqdm(
            total=args.steps,
            initial=step,
            desc="train",
            unit="step",
            disable=None,
            file=sys.stderr,
        )

    done: list[int] = []  # the last step taken

    def progress(step: int, loss: float) -> None:
        if bar is None:
            begin(step - 1)
        done[:] = [step]
        bar.set_postfix(loss=f"{loss:.4f}", refresh=False)
        bar.update(step - bar.n)

    started = time.time_ns()
    start = time.perf_counter()
    try:
        result = train(
            docs,
            steps=args.steps,
            batch_size=args.batch_size,
            lr=args.lr,
            backend=args.backend,
            device=args.device,
            dtype=args.dtype,
            seed=args.seed,
            config=config,
            tokenizer=tokenizer,
            chunk_size=args.chunk_size,
            workers=args.workers,
            jit=args.jit,
            checkpoint=args.checkpoint,
            checkpoint_every=args.checkpoint_every,
            resume=args.resume,
            overwrite=args.overwrite,
            callback=progress,
        )
    except ResumeError as exc:
        raise ValueError(_resume_error(exc, args)) from exc
    except KeyboardInterrupt:
        raise KeyboardInterrupt(_interrupted(args, done[0] if done else None, started)) from None
    finally:
        if bar is not None:
            bar.close()
    seconds = time.perf_counter() - start
    if bar is None:  # no step to take: the run in the checkpoint was finished
        begin(result.step)
        assert bar is not None
        bar.close()
        note(
            f"the run in {args.checkpoint!r} has taken all its {result.step} steps; "
            "a larger --steps extends it"
        )
    names = (
        sample(
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
    if args.plot is not None:
        if result.losses:
            _plot_losses(
                args.plot,
                result.losses,
                result.start_step,
                f"microgpt-xp ({args.backend} {args.dtype}, batch {args.batch_size})",
            )
        else:
            note(f"no steps were run, so no loss curve was written to {args.plot!r}")
    if args.json:
        print_json(
            {
                "final_loss": final_loss,
                "steps": result.step,
                "steps_run": len(result.losses),
                "seconds": seconds,
                "backend": args.backend,
                "dtype": args.dtype,
                "batch_size": args.batch_size,
                "num_docs": len(docs),
                "config": config.to_dict(),
                "checkpoint": args.checkpoint,
                "samples": names,
            }
        )
        return 0
    steps_run = len(result.losses)
    loss_text = "n/a" if final_loss is None else f"{final_loss:.4f}"
    resumed_at = f" (resumed at step {result.start_step})" if result.start_step else ""
    print(f"done: {steps_run} steps{resumed_at} in {seconds:.1f} s | final loss {loss_text}")
    if args.checkpoint is not None:
        print(f"checkpoint: {args.checkpoint} (step {result.step})")
    if args.plot is not None and result.losses:
        print(f"loss curve: {args.plot}")
    print_samples(names)
    return 0


def _corpus_name(args: argparse.Namespace) -> str:
    return "the embedded corpus" if args.data is None else f"the corpus {args.data!r}"


def _checkpoint_to_resume(args: argparse.Namespace) -> Checkpoint | None:
    """The checkpoint that --resume continues (``None``: no --resume, or no file yet)."""
    if not args.resume or not Path(args.checkpoint).exists():
        return None
    from ..checkpoint import load

    return load(args.checkpoint)


def _config(
    args: argparse.Namespace, docs: Sequence[str], tokenizer: Tokenizer, resumed: Checkpoint | None
) -> GPTConfig:
    """The model shape: the resumed checkpoint's (the shape options given must match
    it), else the options', the block size by default fitting the longest document."""
    from ..config import GPTConfig
    from ..data import block_size_for

    given = {name: getattr(args, name) for name in SPEC_SHAPE}
    if resumed is not None:
        name = args.checkpoint
        if resumed.tokenizer is not None and resumed.tokenizer != tokenizer:
            raise ValueError(
                f"cannot resume {name!r} with --data {args.data or '(the embedded corpus)'}: "
                "its run trained on a corpus of other characters"
            )
        for key, value in given.items():
            saved = getattr(resumed.config, key)
            if value is not None and value != saved:
                option = SHAPE_OPTIONS[key]
                raise ValueError(
                    f"cannot resume {name!r} with {option} {value}: its run has {option} {saved}"
                )
        return resumed.config
    shape = {k: SPEC_SHAPE[k] if v is None else v for k, v in given.items()}
    if given["block_size"] is None:
        fit = block_size_for(docs)
        # the embedded corpus keeps the original's 16 (its longest name fits in it)
        shape["block_size"] = max(SPEC_SHAPE["block_size"], fit) if args.data is None else fit
    return GPTConfig(tokenizer.vocab_size, **shape)


def _shape_text(config: GPTConfig) -> str:
    """`` (n_layer 2, ...)`` for a shape other than the spec's, else nothing (so that the
    default run prints what it always printed)."""
    shape = {name: getattr(config, name) for name in SPEC_SHAPE}
    if shape == SPEC_SHAPE:
        return ""
    return " (" + ", ".join(f"{name} {value}" for name, value in shape.items()) + ")"


def _note_cut(docs: Sequence[str], block_size: int, what: str) -> None:
    """Say on stderr how many documents ``what`` (a block size of ``block_size``) cuts."""
    from ..data import block_size_for, count_cut

    cut = count_cut(docs, block_size)
    if cut:
        note(
            f"{cut} of {len(docs)} documents are longer than {what} reads whole "
            f"({block_size - 1} characters): training sees only their first {block_size} "
            f"characters, never their end (--block-size {block_size_for(docs)} fits the "
            "longest)"
        )


def _resume_error(exc: ResumeError, args: argparse.Namespace) -> str:
    """A ResumeError in the words of the command line: the option, given and saved."""
    name = args.checkpoint
    option = RESUME_OPTIONS.get(exc.option, exc.option)
    if exc.option == "docs":
        given = args.data or "(the embedded corpus)"
        return (
            f"cannot resume {name!r} with --data {given}: its run trained on another corpus "
            f"({exc.saved}, not {exc.given})"
        )
    text = f"cannot resume {name!r} with {option} {exc.given}: its run has {option} {exc.saved}"
    if exc.option == "steps":
        text += " (a finished run is extended by a larger --steps; an unfinished one keeps its own)"
    return text


def _interrupted(args: argparse.Namespace, step: int | None, started_ns: int) -> str:
    """What Ctrl-C during training prints: where it stopped, the last checkpoint, and
    the command that continues the run."""
    where = "interrupted" + ("" if step is None else f" after step {step}")
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
    return (
        f"{where}; the last checkpoint is {args.checkpoint}{saved}; continue the run with: "
        f"{resume_command(args.argv)}"
    )


def resume_command(argv: Sequence[str]) -> str:
    """The command line ``argv`` of ``microgpt-xp`` with ``--resume`` instead of
    ``--overwrite`` (argparse also takes unambiguous prefixes, ``--over``)."""

    def is_flag(arg: str, flag: str) -> bool:
        return len(arg) > 3 and flag.startswith(arg)

    kept = [a for a in argv if not is_flag(a, "--overwrite")]
    if not any(is_flag(a, "--resume") for a in kept):
        kept.append("--resume")
    return shlex.join([PROG, *kept])


def _run_exact(args: argparse.Namespace) -> int:
    """``train --microgpt-exact``: :func:`microgpt_xp.exact.run_exact`, printing what the
    original prints."""
    not_applicable = {
        "--batch-size": args.batch_size != DEFAULT_BATCH_SIZE,
        "--lr": args.lr != DEFAULT_LR,
        "--seed": args.seed != DEFAULT_SEED,
        "--dtype": args.dtype != "float32",
        "--resume": args.resume,
        "--checkpoint-every": args.checkpoint_every != 0,
        "--chunk-size": args.chunk_size is not None,
        "--workers": args.workers is not None,
        "--scheduler": args.scheduler is not None,
    }
    given = [flag for flag, used in not_applicable.items() if used]
    if given:
        raise UsageError(
            f"{', '.join(given)} cannot be used with --microgpt-exact "
            "(it always trains on one document a step in float64 from seed 42)"
        )
    if args.overwrite and args.checkpoint is None:
        raise UsageError("--overwrite needs --checkpoint PATH")
    _check_plot(args.plot)
    _check_checkpoint_free(args)
    check_device(args.backend, args.device)
    docs = read_docs(args.data)
    if args.data is None:
        note(
            f"no --data: using the embedded corpus ({len(docs)} names); the original microgpt "
            "trained on makemore's names.txt"
        )
    shape: dict[str, Any] = {
        k: SPEC_SHAPE[k] if getattr(args, k) is None else getattr(args, k) for k in SPEC_SHAPE
    }
    size = shape["block_size"]
    _note_cut(
        docs,
        size,
        f"the original's block size {size}" if args.block_size is None else f"--block-size {size}",
    )

    from ..exact import run_exact

    start = time.perf_counter()
    # run_exact prints the original's lines itself (print_fn's default) unless --json
    printing: dict[str, Any] = {"print_fn": None} if args.json else {}
    replay = run_exact(
        docs,
        backend=args.backend,
        device=args.device,
        num_steps=args.steps,
        num_samples=args.num_samples,
        temperature=args.temperature,
        newlines=args.newlines,
        **shape,
        **printing,
    )
    seconds = time.perf_counter() - start
    if args.checkpoint is not None:
        from ..checkpoint import save

        version, internal, gauss_next = replay.sample_rng_state
        assert replay.params is not None and replay.adam is not None
        save(
            args.checkpoint,
            replay.params,
            adam=replay.adam,
            step=len(replay.losses),
            tokenizer=replay.tokenizer,
            meta={"microgpt_exact": {"sample_rng_state": [version, list(internal), gauss_next]}},
        )
    if args.plot is not None:
        _plot_losses(args.plot, replay.losses, 0, "microgpt-exact (one document a step, float64)")
    if args.json:
        assert replay.params is not None
        print_json(
            {
                "mode": "microgpt-exact",
                "final_loss": replay.losses[-1] if replay.losses else None,
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


# -- the loss curve -------------------------------------------------------------------------
def _check_plot(path: str | None) -> None:
    """Fail before training if ``--plot`` cannot be written."""
    if path is None:
        return
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
    except ImportError as exc:
        from .._backends import install_extra

        raise ImportError(f"--plot needs matplotlib: {install_extra('plot')} ({exc})") from exc
    suffix = Path(path).suffix.lstrip(".").lower()
    formats = FigureCanvasAgg.get_supported_filetypes()
    if suffix not in formats:
        raise ValueError(
            f"--plot {path!r}: unsupported image format {suffix!r}; use one of "
            f"{', '.join(sorted(formats))}"
        )
    parent = Path(path).parent
    if not parent.is_dir():
        raise FileNotFoundError(f"--plot {path!r}: folder {str(parent)!r} does not exist")


def _plot_losses(path: str, losses: Sequence[float], first_step: int, title: str) -> None:
    """Save the per-step losses (step ``first_step + 1`` first) and their running mean."""
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    # No pyplot: a bare Figure on an Agg canvas leaves matplotlib's global state alone.
    fig = Figure(figsize=(7, 4), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    steps = np.arange(first_step + 1, first_step + len(losses) + 1)
    ax.plot(steps, losses, lw=0.6, alpha=0.5, label="batch loss")
    window = max(1, len(losses) // 50)
    if window > 1:
        smooth = np.convolve(losses, np.ones(window) / window, mode="valid")
        ax.plot(steps[window - 1 :], smooth, lw=1.5, label=f"mean of {window} steps")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.savefig(path, dpi=120)
