"""The microgpt-xp command: train microgpt, sample names, score a corpus and export
weights, on any supported array backend.

Every subcommand has --help. A mistake (a missing file, a bad option value, a corrupt
checkpoint, ...) prints one "microgpt-xp: error: ..." line to stderr and exits with 2
(usage errors) or 1 (everything else). Set MICROGPT_XP_TRACEBACK=1 to see the full
traceback of such an error instead.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from .. import __version__
from .._alloc import tune_malloc
from . import eval as evaluate
from . import export, sample, train
from ._common import PROG, Formatter, Parser, UsageError, error, one_line

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``microgpt-xp`` and its subcommands (one module of this
    package each; each subcommand's parsed arguments carry its ``handler``)."""
    parser = Parser(prog=PROG, description=__doc__, formatter_class=Formatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in (train, sample, evaluate, export):
        command.add_parser(sub)
    return parser


def _user_errors() -> tuple[type[BaseException], ...]:
    """The exceptions that mean a user mistake (imported only once one is raised)."""
    from ..checkpoint import CheckpointError
    from ..cluster import ClusterError
    from ..data import DataError
    from ..train import TrainingError

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
    return one_line(str(exc)) or type(exc).__name__


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
        error(str(exc))
        return 2
    except KeyboardInterrupt:
        error("interrupted")
        return 130
    except _user_errors() as exc:
        if os.environ.get("MICROGPT_XP_TRACEBACK"):
            raise
        error(_describe(exc))
        return 1
