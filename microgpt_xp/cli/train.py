"""``microgpt-xp train``: batched training (:func:`microgpt_xp.train`) then sampling, or
with ``--microgpt-exact`` the original script's run (:func:`microgpt_xp.run_exact`)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .._xp import DTYPES
from ._common import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_LR,
    DEFAULT_NUM_SAMPLES,
    DEFAULT_SEED,
    DEFAULT_STEPS,
    DEFAULT_TEMPERATURE,
    Subcommands,
    UsageError,
    add_backend_options,
    add_command,
    add_json_option,
    add_scheduler_option,
    add_workers_option,
    check_device,
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


def add_parser(sub: Subcommands) -> None:
    """Add the ``train`` subcommand to ``sub`` (the result of ``add_subparsers``)."""
    t = add_command(
        sub,
        "train",
        "train on a data file or the embedded default corpus, then sample names",
        "Train microgpt with batched Adam and print sampled names.\n\n"
        "With --microgpt-exact, replay the original microgpt script instead: Python's\n"
        "random seeded with 42, one document per step in float64, the same printed output.\n"
        "--steps, --num-samples, --temperature, --backend, --device, --data, --checkpoint,\n"
        "--plot and --json apply in that mode too; the other training options do not.",
    )
    add_backend_options(t)
    t.add_argument(
        "--dtype", choices=DTYPES, default="float32", help="floating dtype of the weights"
    )
    t.add_argument(
        "--steps",
        type=positive_int,
        default=DEFAULT_STEPS,
        help="number of Adam steps (also the length of the linear learning-rate decay)",
    )
    t.add_argument(
        "--batch-size", type=positive_int, default=DEFAULT_BATCH_SIZE, help="documents per step"
    )
    t.add_argument("--lr", type=positive_float, default=DEFAULT_LR, help="initial learning rate")
    t.add_argument(
        "--data",
        metavar="FILE",
        default=None,
        help="UTF-8 text file, one document per line. None: the embedded corpus of "
        "English first names",
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
        help="save params, optimizer state and tokenizer here at the end (and every "
        "--checkpoint-every steps). None: no checkpoint",
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
        help="continue from --checkpoint if it exists (same --steps, --data and --seed)",
    )
    t.add_argument(
        "--chunk-size",
        metavar="N",
        type=positive_int,
        default=None,
        help="dask: documents per chunk of the batch axis. None: one chunk",
    )
    add_workers_option(t)
    add_scheduler_option(t)
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


def run(args: argparse.Namespace) -> int:
    """Check the options, then train (on the ``--scheduler`` cluster if given)."""
    if args.microgpt_exact:
        return _run_exact(args)
    if args.newlines:
        raise UsageError("--newlines applies only with --microgpt-exact")
    if (args.resume or args.checkpoint_every) and args.checkpoint is None:
        raise UsageError("--resume and --checkpoint-every need --checkpoint PATH")
    if args.chunk_size is not None and args.backend != "dask":
        raise UsageError("--chunk-size applies only with --backend dask")
    check_workers(args)
    check_scheduler(args)
    _check_plot(args.plot)
    check_device(args.backend, args.device)
    with dask_client(args.scheduler):
        return _train(args)


def _train(args: argparse.Namespace) -> int:
    """Batched training (``train`` without ``--microgpt-exact``), inside the scheduler."""
    docs = read_docs(args.data)

    from tqdm import tqdm

    from ..config import GPTConfig
    from ..data import Tokenizer
    from ..sample import sample
    from ..train import train

    tokenizer = Tokenizer.from_docs(docs)
    if not args.json:
        print(
            f"train: {len(docs)} docs | vocab {tokenizer.vocab_size} | "
            f"{GPTConfig(tokenizer.vocab_size).num_params} params | {args.backend} "
            f"{args.dtype} | batch {args.batch_size} | {args.steps} steps"
        )
    if args.resume and not Path(args.checkpoint).exists():
        note(f"--resume: {args.checkpoint!r} does not exist yet; starting from step 0")

    start = time.perf_counter()
    with tqdm(total=args.steps, desc="train", unit="step", disable=None, file=sys.stderr) as bar:

        def progress(step: int, loss: float) -> None:
            bar.set_postfix(loss=f"{loss:.4f}", refresh=False)
            bar.update(step - bar.n)

        result = train(
            docs,
            steps=args.steps,
            batch_size=args.batch_size,
            lr=args.lr,
            backend=args.backend,
            device=args.device,
            dtype=args.dtype,
            seed=args.seed,
            tokenizer=tokenizer,
            chunk_size=args.chunk_size,
            workers=args.workers,
            checkpoint=args.checkpoint,
            checkpoint_every=args.checkpoint_every,
            resume=args.resume,
            callback=progress,
        )
    seconds = time.perf_counter() - start
    names = (
        sample(
            result.params,
            result.tokenizer,
            args.num_samples,
            temperature=args.temperature,
            seed=args.seed,
            chunks=args.chunk_size,
            workers=args.workers,
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
                "checkpoint": args.checkpoint,
                "samples": names,
            }
        )
        return 0
    steps_run = len(result.losses)
    loss_text = "n/a" if final_loss is None else f"{final_loss:.4f}"
    resumed = f" (resumed at step {result.start_step})" if result.start_step else ""
    print(f"done: {steps_run} steps{resumed} in {seconds:.1f} s | final loss {loss_text}")
    if args.checkpoint is not None:
        print(f"checkpoint: {args.checkpoint} (step {result.step})")
    if args.plot is not None and result.losses:
        print(f"loss curve: {args.plot}")
    print_samples(names)
    return 0


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
    _check_plot(args.plot)
    check_device(args.backend, args.device)
    docs = read_docs(args.data)
    if args.data is None:
        note(
            f"no --data: using the embedded corpus ({len(docs)} names); the original microgpt "
            "trained on makemore's names.txt"
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
        raise ImportError(
            f"--plot needs matplotlib: pip install 'microgpt-xp[plot]' ({exc})"
        ) from exc
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
