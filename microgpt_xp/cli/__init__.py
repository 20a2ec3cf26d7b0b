"""The microgpt-xp command: train microgpt, sample names, score a corpus, export weights
or the model's graph, and replay the original script, on any supported array backend.

Every subcommand has --help. A mistake (a missing file, a bad option value, a corrupt
checkpoint, ...) or a lost resource (memory, a Dask scheduler, a worker process) prints
one "microgpt-xp: error: ..." line to stderr and exits with 2 (usage errors) or 1
(everything else); Ctrl-C exits with 130, SIGTERM with 143 and SIGHUP with 129 (train
says how to resume). A reader of stdout that goes away (`sample | head`) ends the
command quietly with 0. Set MICROGPT_XP_TRACEBACK=1 to see the full traceback of such
an error instead.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
from collections.abc import Callable, Iterator, Sequence

from .. import __version__
from .._alloc import tune_malloc
from . import eval as evaluate
from . import export, replay, sample, train
from ._common import PROG, Formatter, Parser, UsageError, error, in_option_words, one_line

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``microgpt-xp`` and its subcommands (one module of this
    package each; each subcommand's parsed arguments carry its ``handler``)."""
    parser = Parser(prog=PROG, description=__doc__, formatter_class=Formatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in (train, sample, evaluate, export, replay):
        command.add_parser(sub)
    return parser


def _user_errors() -> tuple[type[BaseException], ...]:
    """The exceptions that mean a user mistake (imported only once one is raised)."""
    from ..checkpoint import CheckpointError
    from ..cluster import ClusterError
    from ..data import DataError
    from ..runners import WorkerDied
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
        WorkerDied,
    )


def _describe(exc: BaseException) -> str:
    """One line for a library error, in the command line's words."""
    return in_option_words(one_line(str(exc)) or type(exc).__name__)


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where the program is, as Ctrl-C is (``signum`` says which)."""

    def __init__(self, signum: int) -> None:
        super().__init__()
        self.signum = signum


@contextlib.contextmanager
def _stop_on_signals() -> Iterator[None]:
    """SIGTERM and SIGHUP raise :class:`Stopped` inside the block (so that training says
    how to resume and a partial output file is removed), then the handlers are restored."""

    def stop(signum: int, frame: object) -> None:
        raise Stopped(signum)

    wanted = [getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name)]
    try:
        previous = {s: signal.signal(s, stop) for s in wanted}
    except ValueError:  # not the main thread: signals stay as they are
        yield
        return
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


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
        with _stop_on_signals():
            return int(handler(args))
    except SystemExit as exc:  # --help, --version and argparse's usage errors
        return _exit_status(exc.code)
    except UsageError as exc:
        error(str(exc))
        return 2
    except KeyboardInterrupt as exc:  # train raises it again with how to resume
        error(_describe(exc) if str(exc) else "interrupted")
        return 128 + (getattr(exc, "signum", None) or signal.SIGINT)
    except BrokenPipeError:
        # the reader of stdout went away (`microgpt-xp sample | head`): it has what it
        # wanted, so stop quietly and successfully, as
        # https://docs.python.org/3/library/signal.html#note-on-sigpipe recommends
        _silence_stdout()
        return 0
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
