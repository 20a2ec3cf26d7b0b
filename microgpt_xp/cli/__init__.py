"""The microgpt-xp command: train microgpt, sample names, score a corpus and export
weights, on any supported array backend.

Every subcommand has --help. A mistake (a missing file, a bad option value, a corrupt
checkpoint, ...) or a lost resource (memory, a Dask scheduler) prints one
"microgpt-xp: error: ..." line to stderr and exits with 2 (usage errors) or 1
(everything else); Ctrl-C exits with 130 (train says how to resume). Set
MICROGPT_XP_TRACEBACK=1 to see the full traceback of such an error instead.
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


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's last flush of what is still
    buffered does not raise BrokenPipeError again at exit."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a real file (a test's buffer)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


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
        args.argv = arguments  # what a command prints to be run again (train --resume)
        # the command owns its process: keep step temporaries mapped between steps
        tune_malloc()
        handler: Callable[[argparse.Namespace], int] = args.handler
        return int(handler(args))
    except SystemExit as exc:  # --help, --version and argparse's usage errors
        return _exit_status(exc.code)
    except UsageError as exc:
        error(str(exc))
        return 2
    except KeyboardInterrupt as exc:  # train raises it again with how to resume
        error(_describe(exc) if str(exc) else "interrupted")
        return 130
    except BrokenPipeError:
        # the reader of stdout went away (`microgpt-xp sample | head`): stop quietly, as
        # https://docs.python.org/3/library/signal.html#note-on-sigpipe recommends
        _silence_stdout()
        return 1
    except MemoryError as exc:
        if os.environ.get("MICROGPT_XP_TRACEBACK"):
            raise
        detail = f" ({_describe(exc)})" if str(exc) else ""
        error(f"out of memory{detail}; a smaller --batch-size (or --chunk-size) needs less")
        return 1
    except _user_errors() as exc:
        if os.environ.get("MICROGPT_XP_TRACEBACK"):
            raise
        error(_describe(exc))
        return 1
