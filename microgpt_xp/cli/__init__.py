"""The microgpt-xp command: train microgpt, sample names, score a corpus, export weights
or the model's graph, and replay the original script, on any supported array backend.

A mistake or a lost resource prints one "microgpt-xp: error: ..." line and exits with 2
(usage errors) or 1; Ctrl-C exits with 130, SIGTERM with 143, SIGHUP with 129; a reader of
stdout that goes away ends it with 0. MICROGPT_XP_TRACEBACK=1 shows the traceback instead,
MICROGPT_XP_VERBOSE=1 (or --verbose) dask.distributed's logs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys

from .._version import __version__

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Iterator, Sequence
    from typing import Any

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``microgpt-xp``: one module per subcommand, whose arguments carry its
    ``handler``."""
    from . import eval as evaluate
    from . import export, replay, sample, train
    from ._common import PROG, Formatter, Parser

    parser = Parser(prog=PROG, description=__doc__, formatter_class=Formatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in (train, sample, evaluate, export, replay):
        command.add_parser(sub)
    return parser


def _user_errors() -> tuple[type[BaseException], ...]:
    """The exceptions that mean a user mistake (imported only once one is raised)."""
    from ..cluster import ClusterError
    from ..runners import WorkerDied
    from ..train import TrainingError

    return (ValueError, TypeError, ImportError, OSError, ClusterError, WorkerDied, TrainingError)


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where the program is, as Ctrl-C is (``signum`` says which)."""

    def __init__(self, signum: int) -> None:
        super().__init__()
        self.signum = signum


@contextlib.contextmanager
def _stop_on_signals() -> Iterator[None]:
    """SIGTERM and SIGHUP raise :class:`Stopped` inside the block (so that training says how
    to resume and a partial output is removed); outside the main thread, nothing."""

    def stop(signum: int, frame: object) -> None:
        raise Stopped(signum)

    previous = {}
    with contextlib.suppress(ValueError):  # not the main thread
        for name in ("SIGTERM", "SIGHUP"):
            if hasattr(signal, name):
                previous[name] = signal.signal(getattr(signal, name), stop)
    try:
        yield
    finally:
        for name, handler in previous.items():
            signal.signal(getattr(signal, name), handler)


def main(argv: Sequence[str] | None = None) -> int:
    """The ``microgpt-xp`` command on ``argv`` (default ``sys.argv[1:]``); its exit status:
    2 for usage errors, 1 for other user errors, each after one error line."""
    try:  # the modules every command needs: Ctrl-C while they load is the same one line
        from . import _common

        return _main(list(sys.argv[1:] if argv is None else argv), _common)
    except KeyboardInterrupt:
        sys.stderr.write("microgpt-xp: error: interrupted\n")  # _common.error, unloaded
        return 130


def _main(arguments: list[str], cli: Any) -> int:
    error, UsageError = cli.error, cli.UsageError
    if sys.stdout is None:  # started with stdout closed (`>&-`): what it prints is lost
        error("stdout is closed: redirect it (e.g. >/dev/null) to run without output")
        return 1
    try:
        args = build_parser().parse_args(arguments)
        args.argv = arguments  # what a command prints to be run again (train --resume)
        from .._alloc import tune_malloc

        tune_malloc()  # the command owns its process: keep step temporaries mapped
        with _stop_on_signals():
            return int(args.handler(args))
    except SystemExit as exc:  # --help, --version and argparse's usage errors
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        sys.stderr.write(f"{exc.code}\n")
        return 1
    except UsageError as exc:
        error(str(exc))
        return 2
    except KeyboardInterrupt as exc:  # train raises it again with how to resume
        error(str(exc) or "interrupted")
        return 128 + (getattr(exc, "signum", None) or signal.SIGINT)
    except BrokenPipeError:  # the reader of stdout went away (`sample | head`): it has what
        # it wanted. Point stdout at /dev/null, so that the last flush at exit does not fail
        # again (docs.python.org, "Note on SIGPIPE"); not a real file: nothing to do.
        with contextlib.suppress(AttributeError, OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        return 0
    except MemoryError as exc:
        if os.environ.get("MICROGPT_XP_TRACEBACK"):
            raise
        detail = f" ({cli.in_option_words(exc)})" if str(exc) else ""
        error(f"out of memory{detail}; a smaller --batch-size (or --chunk-size) needs less")
        return 1
    except _user_errors() as exc:
        if os.environ.get("MICROGPT_XP_TRACEBACK"):
            raise
        error(cli.in_option_words(exc))
        return 1
