"""What the subcommands share: every option, declared once (:data:`ARGUMENTS`), the table
of library parameters and their options (:data:`OPTIONS`), the checks made before any work,
and the printing of notes, samples and JSON."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import math
import os
import signal
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn, TypeAlias

import numpy as np

from .. import _xp, cluster, data
from .._backends import install_extra
from .._files import atomic_write, check_writable, same_file
from .._xp import BACKENDS, DTYPES
from ..data import read_text as read_text  # the characters of --text, line breaks included
from ..resources import default_threads, usable_cpus, use_threads
from ..runners.processes import check_workers
from ..sample import DEFAULT_BATCH_SIZE

PROG = "microgpt-xp"
SPEC_SHAPE = {"n_layer": 1, "n_embd": 16, "n_head": 4, "block_size": 16}  # the defaults
DEFAULT_NUM_SAMPLES = 20  # names sampled without --num-samples (a text checkpoint: 1 passage)


class UsageError(Exception):
    """A combination of options that cannot be used together (exit status 2)."""


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line: ``microgpt-xp: error: ...``."""

    def error(self, message: str) -> NoReturn:
        """Print one error line (with a pointer to ``--help``) and exit with status 2."""
        self.exit(2, f"{PROG}: error: {one_line(message)} (see '{self.prog} --help')\n")


class Formatter(argparse.RawDescriptionHelpFormatter):
    """Keep the line breaks of descriptions, and end an option's help with ``(default:
    VALUE)`` unless it is required, a flag, ``None`` or already said."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        unsaid = all(action.default is not v for v in (None, False, argparse.SUPPRESS))
        if "(default" in text or action.required or not unsaid:
            return text
        return f"{text} (default: %(default)s)"


Subcommands: TypeAlias = "argparse._SubParsersAction[Parser]"


def number(
    kind: type, least: float, *, strict: bool = False, below: float | None = None
) -> Callable[[str], Any]:
    """An argparse ``type=``: an int, or a finite float, ``>= least`` (``>`` if ``strict``),
    ``< below`` if given."""
    rule = f"{'>' if strict else '>='} {least:g}" + ("" if below is None else f" and < {below:g}")

    def parse(text: str) -> Any:
        try:
            value = kind(text)
            fits = value > least if strict else value >= least
        except ValueError:
            fits = False
        if not (fits and (below is None or value < below)) or not math.isfinite(value):
            what = "an integer" if kind is int else "a finite number"
            raise argparse.ArgumentTypeError(f"expected {what} {rule}, got {text!r}")
        return value

    return parse


positive_int, nonnegative_int = number(int, 1), number(int, 0)
positive_float, nonnegative_float = number(float, 0, strict=True), number(float, 0)
decay_rate = number(float, 0, below=1)  # Adam's beta1, beta2: [0, 1)


def worker_count(text: str) -> int:
    """``--workers``: a positive count within the library's bound (:func:`check_workers`)."""
    try:
        return check_workers(positive_int(text))  # type: ignore[return-value]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def thread_count(text: str) -> int | str:
    """``--threads``: ``auto``, or a positive count capped (with a note) at this process's
    cores, so that no larger count reaches a native thread pool."""
    if text == "auto":
        return text
    value: int = positive_int(text)
    if value > (cpus := usable_cpus()):
        note(f"--threads {value}: this process may use {cpus} cores; using {cpus}")
    return min(value, cpus)


def opt(help: str, default: Any = None, type: Any = None, **more: Any) -> dict[str, Any]:
    """The keywords of ``add_argument`` for an option (``N`` stands for a count)."""
    if type in (positive_int, nonnegative_int) and "metavar" not in more:
        more["metavar"] = "N"
    return {"help": help, "default": default, **({"type": type} if type else {}), **more}


def flag(help: str) -> dict[str, Any]:
    return {"action": "store_true", "help": help}


#: Every option of every subcommand, by its ``dest`` (``dest/variant`` where subcommands
#: differ): the keywords of ``add_argument``.
ARGUMENTS: dict[str, dict[str, Any]] = {
    "checkpoint": opt(
        "checkpoint to load (from 'train --checkpoint')", metavar="PATH", required=True
    ),
    "checkpoint/save": opt(
        "save the run here at the end, every --checkpoint-every steps and at Ctrl-C or SIGTERM "
        "(replay: at the end, with its random state); an existing file needs --resume or "
        "--overwrite (default: no checkpoint)",
        metavar="PATH",
    ),
    "data": opt("UTF-8 file, one document a line (default: the embedded names)", metavar="FILE"),
    "text": opt("UTF-8 file read as one stream of characters (not with --data)", metavar="FILE"),
    "val_data": opt("held-out documents (with --text: held-out text)", metavar="FILE"),
    "val_fraction": opt(
        "hold out this fraction of --data (fixed by --seed), or the end of --text",
        type=positive_float,
        metavar="F",
    ),
    "eval_tokens": opt(
        "predicted held-out tokens scored an evaluation, at most (default: about a tenth of "
        "the run's time)",
        type=positive_int,
    ),
    "eval_every": opt(
        "score the held-out part every N steps and after the last (default: a tenth of the run)",
        type=positive_int,
    ),
    "backend": opt("array backend", "numpy", choices=BACKENDS),
    "device": opt("device of the backend, e.g. 'cpu', 'cuda:0' (default: the backend's)"),
    "dtype": opt("floating dtype of the weights", "float32", choices=DTYPES),
    "steps": opt(
        "Adam steps, the length of the decay (--resume: more extend a finished run)",
        1000,
        positive_int,
        metavar="STEPS",
    ),
    "batch_size": opt("documents per step", 32, positive_int, metavar="BATCH_SIZE"),
    "batch_size/sample": opt(
        "samples generated at once: memory grows with it, the names do not depend on it",
        DEFAULT_BATCH_SIZE,
        positive_int,
    ),
    "lr": opt("initial learning rate (the peak, after --warmup)", 0.01, positive_float),
    "warmup": opt("steps of linear rise to --lr (default: 0, none)", type=nonnegative_int),
    "decay": opt("decay to --min-lr (default: linear)", choices=("linear", "cosine")),
    "min_lr": opt("where the decay ends (default: 0)", type=nonnegative_float, metavar="LR"),
    "weight_decay": opt(
        "decoupled weight decay, as AdamW (default: 0)", type=nonnegative_float, metavar="WD"
    ),
    "grad_clip": opt(
        "clip the gradients' global L2 norm (default: 0, none)",
        type=nonnegative_float,
        metavar="NORM",
    ),
    "init_std": opt(
        "std of the initial weights (default: 0.08)", type=positive_float, metavar="STD"
    ),
    "beta1": opt("Adam's first-moment decay, in [0, 1) (default: 0.85)", type=decay_rate),
    "beta2": opt("Adam's second-moment decay, in [0, 1) (default: 0.99)", type=decay_rate),
    "seed": opt("seed of the weights, batch order and sampling (sample: of its draws)", 0, int),
    "checkpoint_every": opt("also save every N steps (0: only at the end)", 0, nonnegative_int),
    "resume": flag("continue the run in --checkpoint if it exists (its options must match)"),
    "overwrite": flag("replace an existing --checkpoint with a new run"),
    "pack": flag(
        "pack each step's documents into fewer rows, attention kept within each: the same "
        "loss, little padding (not with --text)"
    ),
    "chunk_size": opt("dask: documents per task (default: one task a batch)", type=positive_int),
    "chunk_size/eval": opt(
        "documents scored at once, per task on dask (default: the most whose activations fit "
        "the memory budget)",
        type=positive_int,
    ),
    "eval_tokens/eval": opt(
        "a text checkpoint: predicted tokens scored, at most (default: all)", type=positive_int
    ),
    "memory_budget": opt("MB of activations a chunk may take", 500, positive_int, metavar="MB"),
    "workers": opt(
        "N processes (not threads) share each batch, at most 4 a core (default: this one alone)",
        type=worker_count,
        metavar="N",
    ),
    "threads": opt(
        "BLAS threads of this process, or 'auto' (the idle cores) (default: for the model)",
        type=thread_count,
        metavar="N",
    ),
    "jit": opt(
        "compile with the backend's compiler, or not (default: where there is one)",
        action=argparse.BooleanOptionalAction,
    ),
    "scheduler": opt(
        "dask.distributed scheduler (tcp://host:8786, a scheduler file, or 'local'); needs "
        "--backend dask (default: Dask's threads here)",
        metavar="ADDRESS",
    ),
    "verbose": flag("with --scheduler: show dask.distributed's logs (or MICROGPT_XP_VERBOSE=1)"),
    "n_layer": opt("transformer blocks (default: 1)", type=positive_int),
    "n_embd": opt("residual channels, a multiple of --n-head (default: 16)", type=positive_int),
    "n_head": opt("attention heads (default: 4)", type=positive_int),
    "block_size": opt(
        "positions the model reads (replay: 16 unless given) (default: the spec's 16, or the "
        "longest document + 1 where that is more)",
        type=positive_int,
    ),
    "plot": opt("save the loss curve to FILE (e.g. loss.png; needs matplotlib)", metavar="FILE"),
    "num_samples": opt("names to sample after training", DEFAULT_NUM_SAMPLES, nonnegative_int),
    "num_samples/train": opt(
        "names to sample after training (default: 20; with --text: 1 passage)",
        type=nonnegative_int,
        metavar="NUM_SAMPLES",
    ),
    "length": opt("with --text: characters of each passage (default: 500)", type=positive_int),
    "length/sample": opt(
        "a text checkpoint: characters after --prompt (default: 500)", type=positive_int
    ),
    "num_samples/sample": opt(
        "names (default: 20; on a text checkpoint: 1 passage)",
        type=positive_int,
        metavar="NUM_SAMPLES",
    ),
    "temperature": opt("sampling temperature", 0.5, positive_float),
    "top_k": opt("draw among the K likeliest (default: all)", type=positive_int, metavar="K"),
    "prompt": opt("the start every name continues (printed with it)", metavar="TEXT"),
    "out/sample": opt("write the names to FILE, all or nothing (default: stdout)", metavar="FILE"),
    "out": opt("file to write ('-': stdout, JSON only)", metavar="FILE", required=True),
    "format": opt("what to write", "json", choices=("json", "onnx")),
    "graph": opt(
        "with --format onnx: the graph (default: forward)",
        choices=("forward", "decode", "generate", "train_step", "train_init"),
    ),
    "json": flag("print JSON instead of text (train, replay: a summary with the losses)"),
    "microgpt_exact": flag(
        "train: replay the original script; sample: continue the random state replay saved"
    ),
    "newlines": flag("with --microgpt-exact: end step lines with a newline instead of '\\r'"),
}

#: The option that sets each library parameter (``param`` of a user error, ``option`` of a
#: ``ResumeError``): the one place where a library error gets the command line's words.
OPTIONS = {
    **{k.split("/")[0]: "--" + k.split("/")[0].replace("_", "-") for k in ARGUMENTS},
    "docs": "--data",
    "val_docs": "--val-data",
    "val_text": "--val-data",
    "fraction": "--val-fraction",
    "num_steps": "--steps",
    "budget_bytes": "--memory-budget",
    "address": "--scheduler",
}


def add_command(sub: Subcommands, name: str, summary: str, description: str, names: str) -> Parser:
    """Add the subcommand ``name`` with the options ``names`` (keys of :data:`ARGUMENTS`,
    space-separated; ``a|b``: mutually exclusive)."""
    p = sub.add_parser(name, help=summary, description=description, formatter_class=Formatter)
    add(p, names)
    return p


def add(p: Any, names: str) -> None:
    """Add the options ``names`` (as :func:`add_command` takes them) to ``p``."""
    for name in names.split():
        if "|" in name:
            add(p.add_mutually_exclusive_group(), name.replace("|", " "))
        else:
            p.add_argument(OPTIONS[name.split("/")[0]], **ARGUMENTS[name])


def keywords(args: argparse.Namespace, names: str, given: bool = False) -> dict[str, Any]:
    """The options ``names`` (space-separated) as the library keywords of the same name;
    ``given``: only those that are not ``None``."""
    pairs = {name: getattr(args, name) for name in names.split()}
    return {k: v for k, v in pairs.items() if not given or v is not None}


def shape_of(
    args: argparse.Namespace, block_size: int | None = None, vocab: int = 2
) -> dict[str, int]:
    """The shape the options give (the spec's where not given, ``block_size`` first);
    :class:`UsageError` when ``--n-embd`` is not a multiple of ``--n-head`` or when the
    weights, their gradients and Adam's two moments would not fit in memory."""
    shape = {k: getattr(args, k) or SPEC_SHAPE[k] for k in SPEC_SHAPE}
    if args.block_size is None and block_size is not None:
        shape["block_size"] = block_size
    if shape["n_embd"] % shape["n_head"]:
        raise UsageError(
            f"--n-embd {shape['n_embd']} is not a multiple of --n-head {shape['n_head']} "
            "(each head takes n_embd / n_head channels)"
        )
    c = shape["n_embd"]
    weights = 2 * vocab * c + shape["block_size"] * c + shape["n_layer"] * 12 * c * c
    need = 4 * weights * (4 if getattr(args, "dtype", "float64") == "float32" else 8)
    with contextlib.suppress(ValueError, OSError, AttributeError):  # no sysconf: not checked
        if need > (memory := os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")):
            given = ", ".join(f"{OPTIONS[k]} {getattr(args, k)}" for k in shape if getattr(args, k))
            raise UsageError(
                f"{given or '--block-size ' + str(shape['block_size'])}: a model of {weights} "
                f"weights needs {need / 2**30:.3g} GiB (weights, gradients, Adam's moments), "
                f"more than this machine's {memory / 2**30:.3g} GiB: give a smaller shape"
            )
    return shape


def note_cut(docs: Sequence[str], size: int, what: str, scored: bool = False) -> None:
    """Say on stderr how many documents ``what`` (a block size of ``size``) cuts."""
    if cut := data.count_cut(docs, size):
        then = (
            f"they are scored on their first {size} characters"
            if scored
            else f"training sees only their first {size} characters, never their end "
            f"(--block-size {data.block_size_for(docs)} fits the longest)"
        )
        note(
            f"{cut} of {len(docs)} documents are longer than {what} reads whole "
            f"({size - 1} characters): {then}"
        )


# -- checks before any work ---------------------------------------------------------------
def check_common(args: argparse.Namespace) -> None:
    """Refuse ``--jit`` without a compiler, ``--scheduler`` off Dask, and a backend or
    device that is missing, before any work."""
    if getattr(args, "jit", None):
        try:
            _xp.compiler(args.backend, True)
        except ValueError:
            raise UsageError(
                f"--jit: backend {args.backend!r} has no compiler; leave --jit out or give --no-jit"
            ) from None
    if getattr(args, "scheduler", None) is not None:
        if not _xp.entry(args.backend).chunked:
            raise UsageError("--scheduler needs --backend dask")
        if importlib.util.find_spec("distributed") is None:
            raise ImportError(f"--scheduler needs dask.distributed: {_xp.entry('dask').install}")
    try:
        _xp.resolve_device(args.backend, args.device)
    except RuntimeError as exc:  # torch.device("bogus"), CUDA without a GPU
        if _xp.entry(args.backend).needs_gpu:
            which = "a GPU" if args.device is None else f"the GPU {args.device!r}"
            raise ValueError(
                f"backend {args.backend!r} needs an NVIDIA GPU with CUDA, and {which} is not "
                f"available here ({exc}); use --backend numpy (or torch, jax) on a CPU"
            ) from exc
        raise ValueError(
            f"unknown device {args.device!r} for backend {args.backend!r}: {exc}"
        ) from exc


#: An option that does nothing without another: the options, one of which it needs.
NEEDS = {
    "newlines": "microgpt_exact",
    **dict.fromkeys(["resume", "overwrite", "checkpoint_every"], "checkpoint"),
    **dict.fromkeys(["eval_every", "eval_tokens"], "val_data val_fraction"),
    "length": "text",
}


def check_needs(args: argparse.Namespace, names: str) -> None:
    """:class:`UsageError` for an option of ``names`` given without one it needs (:data:`NEEDS`)."""
    for option in names.split():
        needed = NEEDS[option].split()
        if getattr(args, option) and all(getattr(args, n, None) in (None, False) for n in needed):
            raise UsageError(f"{OPTIONS[option]} needs {' or '.join(OPTIONS[n] for n in needed)}")


def check_files(args: argparse.Namespace, out: str | None = None) -> None:
    """Outputs never replace inputs: refuse an ``--out`` that is ``--checkpoint`` and a
    ``--checkpoint`` that is ``--data``/``--text``/``--val-data`` (however spelled); fail now
    if ``out`` cannot be written."""
    ckpt = args.checkpoint
    for option in ("data", "text", "val_data"):
        given = getattr(args, option, None)
        if ckpt is not None and given is not None and same_file(ckpt, given):
            raise UsageError(
                f"--checkpoint {ckpt!r} is {OPTIONS[option]} {given!r}: the run would replace "
                "its corpus"
            )
    if out is None or out == "-":
        return
    if same_file(out, ckpt):
        raise UsageError(f"--out {out!r} is --checkpoint {ckpt!r}: it would replace the model")
    check_writable(out, make_parents=False)


def check_plot(path: str | None) -> None:
    """Fail before training if ``--plot`` cannot be written."""
    if path is None:
        return
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
    except ImportError as exc:
        raise ImportError(f"--plot needs matplotlib: {install_extra('plot')} ({exc})") from exc
    suffix = Path(path).suffix.lstrip(".").lower()
    if suffix not in (formats := FigureCanvasAgg.get_supported_filetypes()):
        raise ValueError(
            f"--plot {path!r}: unsupported image format {suffix!r}; use one of "
            f"{', '.join(sorted(formats))}"
        )
    if not (folder := Path(path).parent).is_dir():
        raise FileNotFoundError(f"--plot {path!r}: folder {str(folder)!r} does not exist")


def plot_losses(path: str, losses: Sequence[float], first: int, title: str, val: Any = ()) -> None:
    """Save the per-step losses (step ``first + 1`` first), their running mean and the
    held-out losses ``(step, loss)`` as an image, written atomically."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4), layout="constrained")  # no pyplot: no global state
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    steps = np.arange(first + 1, first + len(losses) + 1)
    ax.plot(steps, losses, lw=0.6, alpha=0.5, label="batch loss")
    if (window := max(1, len(losses) // 50)) > 1:
        smooth = np.convolve(losses, np.ones(window) / window, mode="valid")
        ax.plot(steps[window - 1 :], smooth, lw=1.5, label=f"mean of {window} steps")
    if val:
        at, value = zip(*val, strict=True)
        ax.plot(at, value, "o-", lw=1.5, ms=3, label="held-out loss")
    ax.set(xlabel="step", ylabel="loss", title=title)
    ax.grid(alpha=0.3)
    ax.legend()
    buf = io.BytesIO()
    fig.savefig(buf, dpi=120, format=Path(path).suffix.lstrip(".").lower())
    atomic_write(path, buf.getvalue())


# -- work -----------------------------------------------------------------------------------
@contextlib.contextmanager
def quiet_dask(verbose: bool = False) -> Iterator[None]:
    """:func:`microgpt_xp.cluster.quiet` inside the block, unless ``verbose`` or
    $MICROGPT_XP_VERBOSE (not 0): the command's own lines are the only ones."""
    loud = verbose or os.environ.get("MICROGPT_XP_VERBOSE", "0") not in ("", "0")
    with contextlib.nullcontext() if loud else cluster.quiet():
        yield


@contextlib.contextmanager
def dask_client(args: argparse.Namespace) -> Iterator[None]:
    """Compute on the dask.distributed scheduler at ``--scheduler`` inside the block
    (nothing without one), quietly (:func:`quiet_dask`)."""
    if args.scheduler is None:
        yield
        return
    with quiet_dask(args.verbose), contextlib.ExitStack() as stack:
        # the processes a local cluster spawns inherit SIGINT ignored: Ctrl-C is this
        # command's to handle. Blocked meanwhile, a Ctrl-C here is kept for after.
        handler = signal.getsignal(signal.SIGINT)
        mask = getattr(signal, "pthread_sigmask", lambda *_: None)  # none on Windows
        mask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            client = stack.enter_context(cluster.connect(args.scheduler))
        finally:
            signal.signal(signal.SIGINT, handler)
            mask(signal.SIG_UNBLOCK, {signal.SIGINT})
        stack.enter_context(cluster.computing(client))
        yield


def read_docs(path: str | None) -> list[str]:
    """The documents of ``--data`` (``None``: the embedded corpus)."""
    return data.default_docs() if path is None else data.read_docs(path)


def load_checkpoint(args: argparse.Namespace) -> Any:
    """``--checkpoint`` on ``--backend``/``--device``, with its tokenizer (``CheckpointError``
    if none)."""
    from ..checkpoint import CheckpointError, load

    ck = load(args.checkpoint, backend=args.backend, device=args.device)
    if ck.tokenizer is None:
        raise CheckpointError(f"checkpoint {args.checkpoint!r} holds no tokenizer")
    return ck


def threads_for(args: argparse.Namespace, config: Any, batch: int, workload: str) -> Any:
    """The block that runs on ``--threads``: a count, ``auto`` (the load-aware choice), or by
    default the count for the model, ``batch`` rows of ``workload`` and this machine's cores
    (never its load, so a command repeats its numbers)."""
    threads = args.threads or default_threads(config, batch, workload=workload)
    return use_threads(threads, config=config, batch_size=batch, workload=workload)


# -- output ---------------------------------------------------------------------------------
def in_option_words(exc: BaseException) -> str:
    """A library error as one line, led by the option that sets the parameter it names
    (``param``): ``seed must be ...`` -> ``--seed must be ...``, else ``--option: ...``."""
    text = one_line(str(exc)) or type(exc).__name__
    param = getattr(exc, "param", None) or ""
    if (option := OPTIONS.get(param)) is None:
        return text
    for words in (f"{param} ", f"{param.replace('_', ' ')} "):
        if text.startswith(words):
            return f"{option} {text[len(words) :]}"
    return f"{option}: {text}"


def one_line(text: str) -> str:
    """``text`` with every run of whitespace (line breaks included) made one space."""
    return " ".join(text.split())


def error(message: str, kind: str = "error") -> None:
    """Print ``microgpt-xp: error: message`` (or another ``kind``) as one line on stderr."""
    sys.stderr.write(f"{PROG}: {kind}: {one_line(message)}\n")


def note(message: str) -> None:
    """Print ``microgpt-xp: note: message`` as one line on stderr."""
    error(message, "note")


def print_json(obj: Any) -> None:
    """Print ``obj`` as indented JSON on stdout."""
    print(json.dumps(obj, indent=2))


def print_samples(names: Sequence[str], start: int = 1, passages: bool = False) -> None:
    """Print ``sample  i: name`` lines numbered from ``start`` (``passages``: each under its
    ``sample  i:`` line)."""
    sep = "\n" if passages else " "
    if names:
        print("\n".join(f"sample {i:2d}:{sep}{name}" for i, name in enumerate(names, start)))


def print_json_stream(head: dict[str, Any], key: str, batches: Iterable[Sequence[Any]]) -> None:
    """Print ``{**head, key: [items of all batches]}`` as :func:`print_json` would, writing
    each batch as it comes."""
    opening = json.dumps({**head, key: []}, indent=2)
    sys.stdout.write(opening[: -len("]\n}")])
    first = True
    for batch in batches:
        if batch:
            items = ",\n".join(f"    {json.dumps(item)}" for item in batch)
            sys.stdout.write(("\n" if first else ",\n") + items)
            first = False
    sys.stdout.write("]\n}\n" if first else "\n  ]\n}\n")
