"""What the subcommands of ``microgpt-xp`` share: the parser classes and argparse types,
the options several subcommands take, the checks that must pass before any work starts,
and the printing of notes, samples and JSON."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import logging
import math
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, TypeAlias

from .._xp import BACKENDS

if TYPE_CHECKING:
    from ..checkpoint import Checkpoint
    from ..data import Tokenizer

PROG = "microgpt-xp"

# Defaults shared by several subcommands (and compared against in microgpt-exact mode).
DEFAULT_STEPS = 1000
DEFAULT_BATCH_SIZE = 32
DEFAULT_LR = 0.01
DEFAULT_SEED = 0
DEFAULT_NUM_SAMPLES = 20
DEFAULT_TEMPERATURE = 0.5


class UsageError(Exception):
    """A combination of options that cannot be used together (exit status 2)."""


# -- argument parsing ---------------------------------------------------------------------
class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line: ``microgpt-xp: error: ...``."""

    def error(self, message: str) -> NoReturn:
        """Print one error line (with a pointer to ``--help``) and exit with status 2."""
        self.exit(2, f"{PROG}: error: {one_line(message)} (see '{self.prog} --help')\n")


class Formatter(argparse.RawDescriptionHelpFormatter):
    """Keep the line breaks of descriptions and epilogs, and end an option's help with
    ``(default: VALUE)`` where that says something: not for a required option, a flag, a
    default of ``None`` (the help says in words what happens then) or a help that already
    names its default."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (
            "(default" in text
            or action.required
            or any(action.default is v for v in (None, False, argparse.SUPPRESS))
            or not action.option_strings
        ):
            return text
        return f"{text} (default: %(default)s)"


#: What ``Parser.add_subparsers`` returns; each subcommand module adds its parser to it.
Subcommands: TypeAlias = "argparse._SubParsersAction[Parser]"


def int_at_least(minimum: int, what: str) -> Callable[[str], int]:
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


positive_int = int_at_least(1, "a positive integer")
nonnegative_int = int_at_least(0, "an integer >= 0")


def positive_float(text: str) -> float:
    """An argparse ``type=`` for finite numbers ``> 0``."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def add_command(sub: Subcommands, name: str, summary: str, description: str) -> Parser:
    """Add the subcommand ``name`` to ``sub`` (the result of ``add_subparsers``), with
    ``summary`` in the list of commands and ``description`` atop its ``--help``."""
    return sub.add_parser(name, help=summary, description=description, formatter_class=Formatter)


def add_checkpoint_option(p: argparse.ArgumentParser) -> None:
    """``--checkpoint PATH``, required: the checkpoint to load."""
    p.add_argument(
        "--checkpoint",
        metavar="PATH",
        required=True,
        help="checkpoint to load (written by 'microgpt-xp train --checkpoint PATH'; it "
        "holds the model's shape, weights and tokenizer)",
    )


def add_backend_options(p: argparse.ArgumentParser) -> None:
    """``--backend`` and ``--device``."""
    p.add_argument("--backend", choices=BACKENDS, default="numpy", help="array backend")
    p.add_argument(
        "--device",
        default=None,
        help="device of the backend, e.g. 'cpu', 'cuda:0', 'device1' (array_api_strict) "
        "(default: the backend's default device)",
    )


def add_workers_option(p: argparse.ArgumentParser) -> None:
    """``--workers N``: processes that share each batch (``runner=Processes(N)``)."""
    p.add_argument(
        "--workers",
        metavar="N",
        type=positive_int,
        default=None,
        help="N processes (not threads) share each batch by rows: this one and N-1 "
        "spawned worker processes, ended with the command; the arrays stay on --backend "
        "(default: this process alone)",
    )


def add_threads_option(p: argparse.ArgumentParser) -> None:
    """``--threads N``: BLAS threads of this process (``threads=`` of the library)."""
    p.add_argument(
        "--threads",
        metavar="N",
        type=positive_int,
        default=None,
        help="BLAS threads of this process (default: chosen for the model's size, see "
        "docs/performance.md, Threads)",
    )


def add_jit_option(p: argparse.ArgumentParser) -> None:
    """``--jit/--no-jit``: ``args.jit`` is ``None`` (the default), ``True`` or ``False``,
    the ``jit`` argument of the library's functions."""
    p.add_argument(
        "--jit",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="compile the computation with the backend's compiler (jax: jax.jit); "
        "--no-jit runs it eagerly; --jit on a backend without a compiler is an error "
        "(default: compile where the backend has a compiler)",
    )


def add_scheduler_option(p: argparse.ArgumentParser) -> None:
    """``--scheduler ADDRESS`` (check it with :func:`check_scheduler`, use it with
    :func:`dask_client`)."""
    p.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        default=None,
        help="a running dask.distributed scheduler to compute on (tcp://host:8786, or the "
        "JSON file of 'dask scheduler --scheduler-file'; 'local' starts a local cluster); "
        "only with --backend dask (default: Dask's threads in this process)",
    )


def add_json_option(p: argparse.ArgumentParser, text: str = "print JSON instead of text") -> None:
    """``--json``, with ``text`` as its help."""
    p.add_argument("--json", action="store_true", help=text)


# -- checks before any work ---------------------------------------------------------------
def check_jit(args: argparse.Namespace) -> None:
    """Refuse ``--jit`` on a backend without a compiler, before any work."""
    from .._xp import compiler

    if args.jit:
        try:
            compiler(args.backend, True)
        except ValueError:
            raise UsageError(
                f"--jit: backend {args.backend!r} has no compiler; leave --jit out or give --no-jit"
            ) from None


def check_scheduler(args: argparse.Namespace) -> None:
    """Refuse ``--scheduler`` without ``--backend dask`` or without ``dask.distributed``
    installed (the address itself is checked by :func:`microgpt_xp.cluster.connect`)."""
    if args.scheduler is None:
        return
    from .. import _xp

    if not _xp.entry(args.backend).chunked:  # a cluster runs Dask tasks
        raise UsageError("--scheduler needs --backend dask")
    if importlib.util.find_spec("distributed") is None:
        raise ImportError(f"--scheduler needs dask.distributed: {_xp.entry('dask').install}")


def check_output(out: str | None, checkpoint: str | None = None, what: str = "--out") -> None:
    """Fail before the work if ``out`` cannot be written, or is the checkpoint itself
    (the same file, however it is spelled)."""
    if out is None or out == "-":
        return
    from .._files import check_writable, same_file

    if checkpoint is not None and same_file(out, checkpoint):
        raise UsageError(
            f"{what} {out!r} is --checkpoint {checkpoint!r}: it would replace the model"
        )
    check_writable(out, make_parents=False)


def check_corpus_kept(args: argparse.Namespace, *options: str) -> None:
    """Refuse a ``--checkpoint`` that is the file of one of ``options`` (``"data"``,
    ``"val_data"``; the same file, however it is spelled): the run would replace its
    corpus."""
    from .._files import same_file

    for option in options:
        given = getattr(args, option)
        if args.checkpoint is not None and given is not None and same_file(args.checkpoint, given):
            raise UsageError(
                f"--checkpoint {args.checkpoint!r} is --{option.replace('_', '-')} {given!r}: "
                "the run would replace its corpus"
            )


def check_device(backend: str, device: str | None) -> None:
    """Import the backend and resolve the device now, so that a bad one fails before any
    work (``ImportError`` for a missing backend, ``ValueError`` for an unknown device or
    a GPU backend on a machine without a usable GPU)."""
    from .. import _xp

    try:
        _xp.resolve_device(backend, device)
    except RuntimeError as exc:  # torch.device("bogus"), CUDA without a GPU
        if _xp.entry(backend).needs_gpu:
            which = "a GPU" if device is None else f"the GPU {device!r}"
            raise ValueError(
                f"backend {backend!r} needs an NVIDIA GPU with CUDA, and {which} is not "
                f"available here ({exc}); use --backend numpy (or torch, jax) on a CPU"
            ) from exc
        raise ValueError(f"unknown device {device!r} for backend {backend!r}: {exc}") from exc


# -- work -----------------------------------------------------------------------------------
@contextlib.contextmanager
def dask_client(address: str | None) -> Iterator[None]:
    """Compute on the dask.distributed scheduler at ``address`` inside the block (nothing
    for ``None``): :func:`microgpt_xp.cluster.connect`, closed when the block ends, with
    the errors of a scheduler lost mid-computation turned into one ``ClusterError``."""
    if address is None:
        yield
        return
    from .. import cluster

    # a lost scheduler is reported as one ClusterError line; distributed's own log of
    # its reconnection attempts would repeat it
    client_log = logging.getLogger("distributed.client")
    level = client_log.level
    client_log.setLevel(logging.CRITICAL)
    try:
        with cluster.connect(address) as client, cluster.computing(client):
            yield
    finally:
        client_log.setLevel(level)


def read_docs(path: str | None) -> list[str]:
    """The documents of ``--data`` (``None``: the embedded corpus)."""
    from ..data import default_docs, read_docs

    return default_docs() if path is None else read_docs(path)


def checkpoint_tokenizer(ck: Checkpoint, path: str) -> Tokenizer:
    """The tokenizer saved in ``ck`` (loaded from ``path``); ``CheckpointError`` if none."""
    from ..checkpoint import CheckpointError

    if ck.tokenizer is None:
        raise CheckpointError(f"checkpoint {path!r} holds no tokenizer")
    return ck.tokenizer


# -- output ---------------------------------------------------------------------------------
#: The library's words for its arguments and the options that set them: where a library
#: error is put in the command line's words (:func:`in_option_words`), the one place.
OPTIONS = {
    "seed": "--seed",
    "batch size": "--batch-size",
    "steps": "--steps",
    "lr": "--lr",
    "chunk size": "--chunk-size",
    "workers": "--workers",
    "threads": "--threads",
    "eval every": "--eval-every",
    "top_k": "--top-k",
    "temperature": "--temperature",
    "the held-out fraction": "--val-fraction",
}
_ARGUMENT = re.compile(r"^(" + "|".join(map(re.escape, OPTIONS)) + r") (must|is) ")
_KEYWORD = re.compile(r"\b(resume|overwrite)=True\b|\bbackend='(\w+)'")
_SHAPE = re.compile(r"GPTConfig\.n_embd \((\d+)\) must be divisible by n_head \((\d+)\)")
_BATCH = re.compile(r"has (\d+) documents, fewer than the batch size \d+$")


def in_option_words(text: str) -> str:
    """A library error's text with its argument names as the options that set them, and
    a hint where one helps (``seed must be ...`` -> ``--seed must be ...``)."""
    text = _ARGUMENT.sub(lambda m: f"{OPTIONS[m.group(1)]} {m.group(2)} ", text)
    text = _KEYWORD.sub(
        lambda m: f"--{m.group(1)}" if m.group(1) else f"--backend {m.group(2)}", text
    )
    text = _SHAPE.sub(
        r"--n-embd \1 is not a multiple of --n-head \2 (each head takes n_embd / n_head channels)",
        text,
    )
    found = _BATCH.search(text)
    if found:
        text += f": use --batch-size {found.group(1)} (or less), or more documents"
    return text


#: The option of each ``train`` argument a ResumeError can name.
RESUME_OPTIONS = {
    "seed": "--seed",
    "batch_size": "--batch-size",
    "lr": "--lr",
    "dtype": "--dtype",
    "steps": "--steps",
    "docs": "--data",
    "val_docs": "--val-data",
}


def resume_words(exc: Any, args: argparse.Namespace) -> str:
    """A ``ResumeError`` in the words of the command line: the option, given and saved."""
    name = args.checkpoint
    if exc.option in ("docs", "val_docs"):
        given = getattr(args, "data", None) or "(the embedded corpus)"
        held = "" if exc.option == "docs" else " held-out"
        option = "--data" if exc.option == "docs" else "--val-data/--val-fraction"
        return (
            f"cannot resume {name!r} with {option} {given}: its run trained on another{held} "
            f"corpus ({exc.saved}, not {exc.given})"
        )
    option = RESUME_OPTIONS.get(exc.option, exc.option)
    text = f"cannot resume {name!r} with {option} {exc.given}: its run has {option} {exc.saved}"
    if exc.option == "steps":
        text += " (a finished run is extended by a larger --steps; an unfinished one keeps its own)"
    return text


def one_line(text: str) -> str:
    """``text`` with every run of whitespace (line breaks included) made one space."""
    return " ".join(text.split())


def error(message: str) -> None:
    """Print ``microgpt-xp: error: message`` as one line on stderr."""
    sys.stderr.write(f"{PROG}: error: {one_line(message)}\n")


def note(message: str) -> None:
    """Print ``microgpt-xp: note: message`` as one line on stderr."""
    sys.stderr.write(f"{PROG}: note: {one_line(message)}\n")


def print_json(obj: Any) -> None:
    """Print ``obj`` as indented JSON on stdout."""
    print(json.dumps(obj, indent=2))


def print_samples(names: Sequence[str], start: int = 1) -> None:
    """Print ``sample  i: name`` lines, numbered from ``start``."""
    if names:
        print("\n".join(f"sample {i:2d}: {name}" for i, name in enumerate(names, start=start)))


def print_json_stream(head: dict[str, Any], key: str, batches: Iterable[Sequence[Any]]) -> None:
    """Print ``{**head, key: [items of all batches]}`` as :func:`print_json` prints it,
    writing each batch as it comes (memory follows a batch, not the whole list)."""
    opening = json.dumps({**head, key: []}, indent=2)
    assert opening.endswith("[]\n}")
    sys.stdout.write(opening[: -len("]\n}")])
    first = True
    for batch in batches:
        if batch:
            items = ",\n".join(f"    {json.dumps(item)}" for item in batch)
            sys.stdout.write(("\n" if first else ",\n") + items)
            first = False
    sys.stdout.write("]\n}\n" if first else "\n  ]\n}\n")
