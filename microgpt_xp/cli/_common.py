"""What the subcommands of ``microgpt-xp`` share: the parser classes and argparse types,
the options several subcommands take, the checks that must pass before any work starts,
and the printing of notes, samples and JSON."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
from collections.abc import Callable, Iterator, Sequence
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


class Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Show option defaults and keep the line breaks of descriptions and epilogs."""


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
    p.add_argument("--checkpoint", metavar="PATH", required=True, help="checkpoint to load")


def add_backend_options(p: argparse.ArgumentParser) -> None:
    """``--backend`` and ``--device``."""
    p.add_argument("--backend", choices=BACKENDS, default="numpy", help="array backend")
    p.add_argument(
        "--device",
        default=None,
        help="device of the backend, e.g. 'cpu', 'cuda:0', 'device1' (array_api_strict); "
        "None: the backend's default device",
    )


def add_workers_option(p: argparse.ArgumentParser) -> None:
    """``--workers N``: processes that share each NumPy batch (check it with
    :func:`check_workers`)."""
    p.add_argument(
        "--workers",
        metavar="N",
        type=positive_int,
        default=None,
        help="numpy: N processes share each batch by rows (this one and N-1 spawned worker "
        "processes, ended with the command). None: this process alone",
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
        "only with --backend dask. None: dask's local threads",
    )


def add_json_option(p: argparse.ArgumentParser, text: str = "print JSON instead of text") -> None:
    """``--json``, with ``text`` as its help."""
    p.add_argument("--json", action="store_true", help=text)


# -- checks before any work ---------------------------------------------------------------
def check_workers(args: argparse.Namespace) -> None:
    """Refuse ``--workers`` off NumPy."""
    if args.workers is not None and args.backend != "numpy":
        raise UsageError("--workers applies only with --backend numpy")


def check_scheduler(args: argparse.Namespace) -> None:
    """Refuse ``--scheduler`` without ``--backend dask`` (the address itself is checked by
    :func:`microgpt_xp.cluster.connect`)."""
    if args.scheduler is not None and args.backend != "dask":
        raise UsageError("--scheduler needs --backend dask")


def check_device(backend: str, device: str | None) -> None:
    """Import the backend and resolve the device now, so that a bad one fails before any
    work (``ImportError`` for a missing backend, ``ValueError`` for an unknown device)."""
    from .. import _xp

    try:
        _xp.resolve_device(backend, device)
    except RuntimeError as exc:  # torch.device("bogus") raises RuntimeError
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

    with cluster.connect(address) as client, cluster.computing(client):
        yield


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


def print_samples(names: Sequence[str]) -> None:
    """Print ``sample  i: name`` lines, numbered from 1."""
    for i, name in enumerate(names, start=1):
        print(f"sample {i:2d}: {name}")
