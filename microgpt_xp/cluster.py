"""Connecting to (or starting) a ``dask.distributed`` cluster, with clear errors.

:func:`connect` returns a ``distributed.Client``, the default scheduler of every Dask
computation until it is closed; :func:`computing` turns the errors of a computation whose
scheduler went away into one :class:`ClusterError`; :func:`quiet` silences distributed's
own logs (the CLI's choice; the library leaves logging alone). Needs the ``dask`` extra.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import gc
import json
import logging
import os
import traceback
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ._backends import install_extra
from ._errors import ArgumentValueError
from ._xp import check_nonnegative_int, check_positive_int

#: The address that means "start a LocalCluster on this machine".
LOCAL = "local"
_TIMEOUTS = (OSError, asyncio.TimeoutError, concurrent.futures.TimeoutError)


class ClusterError(RuntimeError):
    """A Dask cluster that cannot be reached, has no workers, or was lost mid-computation."""


def _distributed() -> Any:
    try:
        import distributed
    except ImportError as exc:
        raise ImportError(
            f"a Dask cluster needs the 'distributed' package: {install_extra('dask')} ({exc})"
        ) from exc
    return distributed


def connect(
    address: str | None = None,
    *,
    n_workers: int | None = None,
    threads_per_worker: int | None = None,
    processes: bool = True,
    timeout: float = 10.0,
    min_workers: int = 1,
) -> Any:
    """A ``distributed.Client`` for the scheduler at ``address``, or for a new local cluster.

    Args:
        address: a scheduler address (``"tcp://host:8786"``, ``"host:8786"``), the path
            of a scheduler file written by ``dask scheduler --scheduler-file``, or
            ``None``/``"local"`` to start a ``LocalCluster`` here (its dashboard on a free
            port).
        n_workers, threads_per_worker, processes: the shape of a new ``LocalCluster``
            (``None``: Dask's choice); refused with an address.
        timeout: seconds to wait for the scheduler, its handshake (a service that never
            answers, or answers in another protocol, is refused then) and ``min_workers``
            workers; also how long a client tries to reconnect to a lost scheduler.
        min_workers: wait until the scheduler has at least this many workers.

    Returns the client, set as Dask's default scheduler (close it: ``with connect(...) as
    client:``; one that started a ``LocalCluster`` closes it too). Raises
    :class:`ClusterError` (one line) for a scheduler that cannot be reached or is not
    one, an unreadable scheduler file, or too few workers; ``ValueError`` for bad
    arguments.
    """
    distributed = _distributed()
    if not timeout > 0:
        raise ArgumentValueError("timeout", f"timeout must be positive, got {timeout!r}")
    check_nonnegative_int(min_workers, "min_workers")
    if address is None or address == LOCAL:
        shape = {"n_workers": n_workers, "threads_per_worker": threads_per_worker}
        shape = {k: check_positive_int(v, k) for k, v in shape.items() if v is not None}
        where, target = "a new LocalCluster", None
        kwargs: dict[str, Any] = {"processes": processes, "dashboard_address": ":0", **shape}
    else:
        if not isinstance(address, str) or not address.strip():
            raise ArgumentValueError(
                "address", f"the scheduler address must be a non-empty string, got {address!r}"
            )
        if n_workers is not None or threads_per_worker is not None:
            raise ArgumentValueError(
                "n_workers",
                "n_workers/threads_per_worker shape a new local cluster; "
                f"they cannot be given with a scheduler address ({address!r})",
            )
        target, where = address, f"the Dask scheduler at {address!r}"
        if address.endswith(".json"):
            target = _read_scheduler_file(address)
            where = f"the Dask scheduler at {target!r} (from scheduler file {address!r})"
        kwargs = {}
        _handshake(distributed, target, timeout, where)
    try:
        client = distributed.Client(target, timeout=timeout, **kwargs)
    except (ValueError, *_TIMEOUTS) as exc:
        _close_failed_client(distributed, exc)
        if target is None:
            if isinstance(exc, ValueError):
                raise
            raise ClusterError(f"could not start a local Dask cluster: {exc}") from exc
        if isinstance(exc, ValueError):  # a malformed address: no port, an unknown scheme
            raise ValueError(f"invalid Dask scheduler address {target!r}: {exc}") from exc
        raise ClusterError(f"{_unreachable(where, timeout)}: {exc}") from exc
    if min_workers:
        try:
            client.wait_for_workers(min_workers, timeout=timeout)
        except _TIMEOUTS as exc:
            have = len(client.scheduler_info(n_workers=-1).get("workers", {}))
            client.close()
            raise ClusterError(
                f"{where} has {have} worker(s) after {timeout:g} s; {min_workers} needed "
                "(start some with `dask worker ADDRESS`)"
            ) from exc
    return client


def _read_scheduler_file(path: str) -> str:
    """The ``"address"`` of a scheduler file; :class:`ClusterError` otherwise."""
    try:
        info = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ClusterError(f"scheduler file {path!r} does not exist") from None
    except (OSError, UnicodeDecodeError, ValueError):
        info = None
    address = info.get("address") if isinstance(info, dict) else None
    if not isinstance(address, str) or not address.strip():
        raise ClusterError(
            f"scheduler file {path!r} is not one that `dask scheduler --scheduler-file` "
            'writes (a JSON object with the scheduler\'s "address")'
        )
    return address


def _handshake(distributed: Any, address: str, timeout: float, where: str) -> None:
    """Connect to ``address`` and complete Dask's handshake within ``timeout`` seconds
    (plus one, so that a connection that never opens is reported as unreachable), then
    hang up; on a thread of its own, so that it works inside a running event loop."""

    async def shake() -> None:
        comm = await distributed.comm.connect(address, timeout=timeout)
        await comm.close()

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        try:
            pool.submit(asyncio.run, asyncio.wait_for(shake(), timeout + 1.0)).result()
        except ValueError as exc:  # a malformed address: no port, an unknown scheme
            raise ValueError(f"invalid Dask scheduler address {address!r}: {exc}") from exc
        except (asyncio.TimeoutError, concurrent.futures.TimeoutError) as exc:
            raise ClusterError(
                f"{where} accepted the connection but did not answer as a Dask scheduler "
                f"within {timeout:g} s; is it one?"
            ) from exc
        except OSError as exc:
            raise ClusterError(f"{_unreachable(where, timeout)}: {exc}") from exc
        except Exception as exc:  # an answer in another protocol read as Dask frames
            raise ClusterError(
                f"{where} answered, but not as a Dask scheduler (its reply is not Dask's "
                "protocol); is the address a scheduler's, not its dashboard's?"
            ) from exc


def _unreachable(where: str, timeout: float) -> str:
    return f"cannot reach {where} within {timeout:g} s (is a scheduler running there, e.g. `dask scheduler`?)"


def _close_failed_client(distributed: Any, exc: BaseException) -> None:
    """Close now the half-started ``Client`` whose constructor raised ``exc``: left to its
    ``__del__``, that close stops the event-loop runner all clients share, whenever the
    garbage collector runs it (the next Client's start then fails or deadlocks)."""
    for frame, _ in traceback.walk_tb(exc.__traceback__):
        client = frame.f_locals.get("self")
        if frame.f_code is distributed.Client.__init__.__code__ and client is not None:
            with contextlib.suppress(Exception):
                client.close()
            return


@contextmanager
def computing(client: Any = None) -> Iterator[None]:
    """Run a Dask computation inside ``with computing():`` to turn the errors of a lost
    scheduler into a :class:`ClusterError` naming it; other errors pass through.
    ``client``: the active distributed client by default (none: nothing to do)."""
    if client is None:
        with contextlib.suppress(ImportError, ValueError):  # none: threads or synchronous
            client = _distributed().get_client()
    if client is None:
        yield
        return
    address = None if client.scheduler is None else client.scheduler.address
    try:
        yield
    except Exception as exc:
        from distributed.comm.core import CommClosedError

        # a task's own OSError, or a user's cancel, arrives while the client is connected
        lost_kinds = (CommClosedError, concurrent.futures.CancelledError, OSError)
        lost = isinstance(exc, lost_kinds) and client.status != "running"
        cut = getattr(exc, "reason", None) == "scheduler-connection-lost"
        if not (lost or cut):  # cut: a task of the run cancelled, Dask's words add nothing
            raise
        why = "the connection closed" if cut else f"{type(exc).__name__}: {exc}"
        raise ClusterError(
            f"lost the Dask scheduler at {address} during the computation ({why})"
        ) from exc


#: The environment variable through which worker processes started during :func:`quiet`
#: (a ``LocalCluster``'s) read the level of their ``distributed`` logger.
_WORKER_LOG_LEVEL = "DASK_LOGGING__DISTRIBUTED"  # dask config logging.distributed


@contextmanager
def quiet() -> Iterator[None]:
    """Silence ``dask.distributed``'s own output while the block runs: the ``distributed``,
    ``tornado``, ``asyncio`` and ``bokeh`` loggers (and their children) raised to
    ``CRITICAL``, the same for worker processes started meanwhile, and the "Sending large
    graph" warning ignored; all restored at the end. For a program that reports a failure
    in its own words (the CLI, unless ``--verbose``); the library never calls it."""
    with contextlib.suppress(ImportError):
        import distributed  # noqa: F401  (its import sets the levels it would reset)
    names = ("distributed", "tornado", "asyncio", "bokeh")
    known = [*logging.root.manager.loggerDict, *names]
    loggers = {logging.getLogger(n) for n in known if n.split(".")[0] in names}
    saved = {logger: (logger.level, logger.disabled) for logger in loggers}
    env = os.environ.get(_WORKER_LOG_LEVEL)
    os.environ[_WORKER_LOG_LEVEL] = "critical"
    try:
        for logger in loggers:
            logger.setLevel(logging.CRITICAL + 1)
            logger.disabled = True
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="(?i).*large graph")
            yield
            gc.collect()  # tasks the run dropped report here, while still silenced
    finally:
        gc.collect()
        for logger, (level, disabled) in saved.items():
            logger.setLevel(level)
            logger.disabled = disabled
        if env is None:
            os.environ.pop(_WORKER_LOG_LEVEL, None)
        else:
            os.environ[_WORKER_LOG_LEVEL] = env
