"""The microgpt-xp command: train microgpt, sample names, score a corpus and export
weights, on any supported array backend.

Every subcommand has --help. A mistake (a missing file, a bad option value, a corrupt
checkpoint, ...) prints one "microgpt-xp: error: ..." line to stderr and exits with 2
(usage errors) or 1 (everything else). Set MICROGPT_XP_TRACEBACK=1 to see the full
traceback of such an error instead.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from . import __version__
from ._alloc import tune_malloc
from ._xp import BACKENDS, DTYPES

if TYPE_CHECKING:
    from .checkpoint import Checkpoint
    from .data import Tokenizer

PROG = "microgpt-xp"

# Defaults shared by several subcommands (and compared against in microgpt-exact mode).
DEFAULT_STEPS = 1000
DEFAULT_BATCH_SIZE = 32
DEFAULT_LR = 0.01
DEFAULT_SEED = 0
DEFAULT_NUM_SAMPLES = 20
DEFAULT_TEMPERATURE = 0.5
DEFAULT_EVAL_CHUNK = 1024


class UsageError(Exception):
    """A combination of options that cannot be used together (exit status 2)."""


# -- argument parsing ---------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line: ``microgpt-xp: error: ...``."""

    def error(self, message: str) -> NoReturn:
        """Print one error line (with a pointer to ``--help``) and exit with status 2."""
        self.exit(2, f"{PROG}: error: {_one_line(message)} (see '{self.prog} --help')\n")


class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Show option defaults and keep the line breaks of descriptions and epilogs."""


def _int_at_least(minimum: int, what: str) -> Callable[[str], int]:
    """An argparse ``type=`` for integers ``>= minimum``; ``what`` names them in errors."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    return parse


_positive_int = _int_at_least(1, "a positive integer")
_nonnegative_int = _int_at_least(0, "an integer >= 0")


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def _add_backend_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", choices=BACKENDS, default="numpy", help="array backend")
    p.add_argument(
        "--device",
        default=None,
        help="device of the backend, e.g. 'cpu', 'cuda:0', 'device1' (array_api_strict); "
        "None: the backend's default device",
    )


def _add_workers_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--workers",
        metavar="N",
        type=_positive_int,
        default=None,
        help="numpy: threads that share each batch (1: none). None: chosen by the batch's "
        "size and the CPU cores",
    )


def _check_workers(args: argparse.Namespace) -> None:
    if args.workers is not None and args.backend != "numpy":
        raise UsageError("--workers applies only with --backend numpy")


def _add_scheduler_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        default=None,
        help="address of a running dask.distributed scheduler (e.g. tcp://host:8786) to "
        "compute on; only with --backend dask. None: dask's local threads",
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``microgpt-xp`` and its subcommands."""
    parser = _Parser(prog=PROG, description=__doc__, formatter_class=_Formatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    # train ------------------------------------------------------------------------------
    t = sub.add_parser(
        "train",
        help="train on a data file or the embedded default corpus, then sample names",
        description="Train microgpt with batched Adam and print sampled names.\n\n"
        "With --microgpt-exact, replay the original microgpt script instead: Python's\n"
        "random seeded with 42, one document per step in float64, the same printed output.\n"
        "--steps, --num-samples, --temperature, --backend, --device, --data, --checkpoint,\n"
        "--plot and --json apply in that mode too; the other training options do not.",
        formatter_class=_Formatter,
    )
    _add_backend_options(t)
    t.add_argument(
        "--dtype", choices=DTYPES, default="float32", help="floating dtype of the weights"
    )
    t.add_argument(
        "--steps",
        type=_positive_int,
        default=DEFAULT_STEPS,
        help="number of Adam steps (also the length of the linear learning-rate decay)",
    )
    t.add_argument(
        "--batch-size", type=_positive_int, default=DEFAULT_BATCH_SIZE, help="documents per step"
    )
    t.add_argument("--lr", type=_positive_float, default=DEFAULT_LR, help="initial learning rate")
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
        type=_nonnegative_int,
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
        type=_positive_int,
        default=None,
        help="dask: documents per chunk of the batch axis. None: one chunk",
    )
    _add_workers_option(t)
    _add_scheduler_option(t)
    t.add_argument(
        "--plot",
        metavar="FILE",
        default=None,
        help="save the loss curve to FILE (e.g. loss.png; needs matplotlib)",
    )
    t.add_argument(
        "--num-samples",
        type=_nonnegative_int,
        default=DEFAULT_NUM_SAMPLES,
        help="names to sample after training (0: none)",
    )
    t.add_argument(
        "--temperature",
        type=_positive_float,
        default=DEFAULT_TEMPERATURE,
        help="sampling temperature",
    )
    t.add_argument("--json", action="store_true", help="print a JSON summary instead of text")
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
    t.set_defaults(handler=_cmd_train)

    # sample -----------------------------------------------------------------------------
    s = sub.add_parser(
        "sample",
        help="sample names from a checkpoint",
        description="Sample documents (names) from a trained checkpoint through the KV "
        "cache.\n\nWith --microgpt-exact, continue the random state that "
        "'train --microgpt-exact\n--checkpoint' saved, and print the names that run printed.",
        formatter_class=_Formatter,
    )
    s.add_argument("--checkpoint", metavar="PATH", required=True, help="checkpoint to load")
    s.add_argument(
        "--num-samples", type=_positive_int, default=DEFAULT_NUM_SAMPLES, help="names to sample"
    )
    s.add_argument(
        "--temperature",
        type=_positive_float,
        default=DEFAULT_TEMPERATURE,
        help="sampling temperature",
    )
    s.add_argument("--seed", type=int, default=DEFAULT_SEED, help="seed of the sampling draws")
    _add_backend_options(s)
    s.add_argument(
        "--batch-size",
        type=_positive_int,
        default=None,
        help="samples generated at once (the names do not depend on it). None: all",
    )
    _add_workers_option(s)
    s.add_argument("--json", action="store_true", help="print JSON instead of text")
    s.add_argument(
        "--microgpt-exact",
        action="store_true",
        help="sample as the original does, from the random state saved by "
        "'train --microgpt-exact --checkpoint'",
    )
    s.set_defaults(handler=_cmd_sample)

    # eval -------------------------------------------------------------------------------
    e = sub.add_parser(
        "eval",
        help="mean loss of a checkpoint over a corpus",
        description="Score every document of a corpus with a checkpoint and print the mean "
        "of the\nper-document losses (mean negative log-likelihood per predicted token).",
        formatter_class=_Formatter,
    )
    e.add_argument("--checkpoint", metavar="PATH", required=True, help="checkpoint to load")
    e.add_argument(
        "--data",
        metavar="FILE",
        default=None,
        help="UTF-8 text file, one document per line. None: the embedded corpus",
    )
    _add_backend_options(e)
    e.add_argument(
        "--chunk-size",
        metavar="N",
        type=_positive_int,
        default=DEFAULT_EVAL_CHUNK,
        help="documents scored at once; on dask, documents per chunk of the batch axis",
    )
    _add_scheduler_option(e)
    e.add_argument("--json", action="store_true", help="print JSON instead of text")
    e.set_defaults(handler=_cmd_eval)

    # export -----------------------------------------------------------------------------
    x = sub.add_parser(
        "export",
        help="write a checkpoint's weights as JSON in the original's state-dict layout",
        description='Write the weights as JSON: {"wte": [[...]], ..., '
        '"layer0.mlp_fc2": [[...]]},\nthe original microgpt\'s state-dict names and '
        "matrix layout.",
        formatter_class=_Formatter,
    )
    x.add_argument("--checkpoint", metavar="PATH", required=True, help="checkpoint to load")
    x.add_argument("--out", metavar="FILE", required=True, help="JSON file to write ('-': stdout)")
    x.set_defaults(handler=_cmd_export)
    return parser


# -- helpers ------------------------------------------------------------------------------
def _one_line(text: str) -> str:
    return " ".join(text.split())


def _error(message: str) -> None:
    sys.stderr.write(f"{PROG}: error: {_one_line(message)}\n")


def _note(message: str) -> None:
    sys.stderr.write(f"{PROG}: note: {_one_line(message)}\n")


def _user_errors() -> tuple[type[BaseException], ...]:
    """The exceptions that mean a user mistake (imported only once one is raised)."""
    from .checkpoint import CheckpointError
    from .cluster import ClusterError
    from .data import DataError
    from .train import TrainingError

    return (
        ValueError,
        TypeError,
        ImportError,
        OSError,
        DataError,
        CheckpointError,
        TrainingError,
        ClusterError,
    )


def _describe(exc: BaseException) -> str:
    return _one_line(str(exc)) or type(exc).__name__


def _print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2))


def _write_stdout(text: str, end: str) -> None:
    sys.stdout.write(text + end)
    if end == "\r":  # a step line that the next one overwrites: show it now
        sys.stdout.flush()


def _print_samples(names: Sequence[str]) -> None:
    for i, name in enumerate(names, start=1):
        print(f"sample {i:2d}: {name}")


def _check_device(backend: str, device: str | None) -> None:
    """Import the backend and resolve the device now, so that a bad one fails before any
    work (``ImportError`` for a missing backend, ``ValueError`` for an unknown device)."""
    from . import _xp

    try:
        _xp.resolve_device(backend, device)
    except RuntimeError as exc:  # torch.device("bogus") raises RuntimeError
        raise ValueError(f"unknown device {device!r} for backend {backend!r}: {exc}") from exc


def _read_docs(path: str | None) -> list[str]:
    from .data import default_docs, read_docs

    return default_docs() if path is None else read_docs(path)


def _check_scheduler(args: argparse.Namespace) -> None:
    """Refuse ``--scheduler`` without ``--backend dask`` (the address itself is checked by
    :func:`microgpt_xp.cluster.connect`)."""
    if args.scheduler is not None and args.backend != "dask":
        raise UsageError("--scheduler needs --backend dask")


@contextlib.contextmanager
def _dask_scheduler(address: str | None) -> Iterator[None]:
    """Compute on the dask.distributed scheduler at ``address`` inside the block (nothing
    for ``None``): :func:`microgpt_xp.cluster.connect`, closed when the block ends, with
    the errors of a scheduler lost mid-computation turned into one ``ClusterError``."""
    if address is None:
        yield
        return
    from . import cluster

    with cluster.connect(address) as client, cluster.computing(client):
        yield


def _checkpoint_tokenizer(ck: Checkpoint, path: str) -> Tokenizer:
    from .checkpoint import CheckpointError

    if ck.tokenizer is None:
        raise CheckpointError(f"checkpoint {path!r} holds no tokenizer")
    return ck.tokenizer


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


# -- train --------------------------------------------------------------------------------
def _cmd_train(args: argparse.Namespace) -> int:
    if args.microgpt_exact:
        return _train_exact(args)
    if args.newlines:
        raise UsageError("--newlines applies only with --microgpt-exact")
    if (args.resume or args.checkpoint_every) and args.checkpoint is None:
        raise UsageError("--resume and --checkpoint-every need --checkpoint PATH")
    if args.chunk_size is not None and args.backend != "dask":
        raise UsageError("--chunk-size applies only with --backend dask")
    _check_workers(args)
    _check_scheduler(args)
    _check_plot(args.plot)
    _check_device(args.backend, args.device)
    with _dask_scheduler(args.scheduler):
        return _train(args)


def _train(args: argparse.Namespace) -> int:
    """Batched training (``train`` without ``--microgpt-exact``), inside the scheduler."""
    docs = _read_docs(args.data)

    from tqdm import tqdm

    from .config import GPTConfig
    from .data import Tokenizer
    from .sample import sample
    from .train import train

    tokenizer = Tokenizer.from_docs(docs)
    if not args.json:
        print(
            f"train: {len(docs)} docs | vocab {tokenizer.vocab_size} | "
            f"{GPTConfig(tokenizer.vocab_size).num_params} params | {args.backend} "
            f"{args.dtype} | batch {args.batch_size} | {args.steps} steps"
        )
    if args.resume and not Path(args.checkpoint).exists():
        _note(f"--resume: {args.checkpoint!r} does not exist yet; starting from step 0")

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
            _note(f"no steps were run, so no loss curve was written to {args.plot!r}")
    if args.json:
        _print_json(
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
    run = len(result.losses)
    loss_text = "n/a" if final_loss is None else f"{final_loss:.4f}"
    resumed = f" (resumed at step {result.start_step})" if result.start_step else ""
    print(f"done: {run} steps{resumed} in {seconds:.1f} s | final loss {loss_text}")
    if args.checkpoint is not None:
        print(f"checkpoint: {args.checkpoint} (step {result.step})")
    if args.plot is not None and result.losses:
        print(f"loss curve: {args.plot}")
    _print_samples(names)
    return 0


def _train_exact(args: argparse.Namespace) -> int:
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
    _check_device(args.backend, args.device)
    docs = _read_docs(args.data)
    if args.data is None:
        _note(
            f"no --data: using the embedded corpus ({len(docs)} names); the original microgpt "
            "trained on makemore's names.txt"
        )

    from .exact import run_exact

    start = time.perf_counter()
    run = run_exact(
        docs,
        backend=args.backend,
        device=args.device,
        num_steps=args.steps,
        num_samples=args.num_samples,
        temperature=args.temperature,
        newlines=args.newlines,
        print_fn=None if args.json else _write_stdout,
    )
    seconds = time.perf_counter() - start
    if args.checkpoint is not None:
        from .checkpoint import save

        version, internal, gauss_next = run.sample_rng_state
        assert run.params is not None and run.adam is not None
        save(
            args.checkpoint,
            run.params,
            adam=run.adam,
            step=len(run.losses),
            tokenizer=run.tokenizer,
            meta={"microgpt_exact": {"sample_rng_state": [version, list(internal), gauss_next]}},
        )
    if args.plot is not None:
        _plot_losses(args.plot, run.losses, 0, "microgpt-exact (one document a step, float64)")
    if args.json:
        assert run.params is not None
        _print_json(
            {
                "mode": "microgpt-exact",
                "final_loss": run.losses[-1] if run.losses else None,
                "steps": len(run.losses),
                "seconds": seconds,
                "num_docs": len(docs),
                "vocab_size": run.params.config.vocab_size,
                "num_params": run.params.config.num_params,
                "checkpoint": args.checkpoint,
                "samples": run.samples,
            }
        )
    return 0


# -- sample -------------------------------------------------------------------------------
def _cmd_sample(args: argparse.Namespace) -> int:
    _check_workers(args)
    _check_device(args.backend, args.device)
    from .checkpoint import load

    ck = load(args.checkpoint, backend=args.backend, device=args.device)
    tokenizer = _checkpoint_tokenizer(ck, args.checkpoint)
    if args.microgpt_exact:
        names = _sample_exact(args, ck, tokenizer)
    else:
        from .sample import sample

        names = sample(
            ck.params,
            tokenizer,
            args.num_samples,
            temperature=args.temperature,
            seed=args.seed,
            batch_size=args.batch_size,
            workers=args.workers,
        )
    if args.json:
        _print_json(
            {
                "checkpoint": args.checkpoint,
                "step": ck.step,
                "temperature": args.temperature,
                "seed": None if args.microgpt_exact else args.seed,
                "microgpt_exact": args.microgpt_exact,
                "samples": names,
            }
        )
    else:
        _print_samples(names)
    return 0


def _sample_exact(args: argparse.Namespace, ck: Checkpoint, tokenizer: Tokenizer) -> list[str]:
    """``sample --microgpt-exact``: the original's sampling from the saved random state."""
    import random

    from .checkpoint import CheckpointError
    from .exact import sample_exact

    if args.seed != DEFAULT_SEED or args.batch_size is not None or args.workers is not None:
        raise UsageError(
            "--seed, --batch-size and --workers cannot be used with --microgpt-exact "
            "(it continues the saved random state, one name at a time)"
        )
    exact = ck.meta.get("microgpt_exact") if isinstance(ck.meta, dict) else None
    state = exact.get("sample_rng_state") if isinstance(exact, dict) else None
    if state is None:
        raise CheckpointError(
            f"checkpoint {args.checkpoint!r} holds no microgpt-exact random state; "
            "write one with 'microgpt-xp train --microgpt-exact --checkpoint PATH'"
        )
    rng = random.Random()
    try:
        version, internal, gauss_next = state
        rng.setstate((version, tuple(internal), gauss_next))
    except (TypeError, ValueError) as exc:
        raise CheckpointError(
            f"checkpoint {args.checkpoint!r}: malformed microgpt-exact random state ({exc})"
        ) from exc
    return sample_exact(ck.params, tokenizer, rng, args.num_samples, args.temperature)


# -- eval ---------------------------------------------------------------------------------
def _cmd_eval(args: argparse.Namespace) -> int:
    _check_scheduler(args)
    _check_device(args.backend, args.device)
    from .checkpoint import load
    from .scale import score_corpus, score_docs

    # connect first: an unreachable scheduler is reported before any work
    with _dask_scheduler(args.scheduler):
        ck = load(args.checkpoint, backend=args.backend, device=args.device)
        tokenizer = _checkpoint_tokenizer(ck, args.checkpoint)
        docs = _read_docs(args.data)
        if args.backend == "dask":
            scores = score_corpus(ck.params, tokenizer, docs, chunk_size=args.chunk_size)
            mean_loss = scores.compute().mean
        else:
            from tqdm import tqdm

            with tqdm(
                total=len(docs), desc="eval", unit="doc", disable=None, file=sys.stderr
            ) as bar:

                def progress(done: int, total: int) -> None:
                    bar.update(done - bar.n)

                mean_loss = score_docs(
                    ck.params, tokenizer, docs, chunk_size=args.chunk_size, callback=progress
                ).mean
    if args.json:
        _print_json(
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


# -- export -------------------------------------------------------------------------------
def _cmd_export(args: argparse.Namespace) -> int:
    from .checkpoint import load
    from .exact import export_state_dict

    ck = load(args.checkpoint)
    text = json.dumps(export_state_dict(ck.params))
    if args.out == "-":
        print(text)
    else:
        Path(args.out).write_text(text + "\n", encoding="utf-8")
        print(f"wrote {ck.config.num_params} weights to {args.out}")
    return 0


# -- entry point --------------------------------------------------------------------------
def _exit_status(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    sys.stderr.write(f"{code}\n")
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``microgpt-xp`` console script; returns the exit status.

    ``argv`` defaults to ``sys.argv[1:]``. Usage errors return 2, other user errors
    (bad files, checkpoints, values, an unreachable Dask scheduler) 1, each after one
    ``microgpt-xp: error:`` line.
    """
    arguments = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(arguments)
        # the command owns its process: keep step temporaries mapped between steps
        tune_malloc()
        handler: Callable[[argparse.Namespace], int] = args.handler
        return int(handler(args))
    except SystemExit as exc:  # --help, --version and argparse's usage errors
        return _exit_status(exc.code)
    except UsageError as exc:
        _error(str(exc))
        return 2
    except KeyboardInterrupt:
        _error("interrupted")
        return 130
    except _user_errors() as exc:
        if os.environ.get("MICROGPT_XP_TRACEBACK"):
            raise
        _error(_describe(exc))
        return 1


if __name__ == "__main__":
    sys.exit(main())
