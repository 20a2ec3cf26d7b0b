"""Connecting to (or starting) a ``dask.distributed`` cluster, with clear errors.

:func:`connect` returns a ``distributed.Client`` that is the default scheduler of every
Dask computation until it is closed (use it as a context manager). :func:`computing`
turns the errors of a computation whose scheduler went away into one
:class:`ClusterError` naming the scheduler.

Needs the ``dask`` extra (``pip install 'microgpt-xp[dask]'``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ._backends import install_extra
from ._xp import check_nonnegative_int, check_positive_int

#: The address that means "start a LocalCluster on this machine".
LOCAL = "local"

#: Seconds past ``timeout`` that the handshake check waits, so that a connection that
#: never opens is reported by distributed's own connect timeout (as unreachable).
_HANDSHAKE_GRACE = 1.0


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
            ``None``/``"local"`` to start a ``LocalCluster`` on this machine.
        n_workers, threads_per_worker, processes: the shape of a new ``LocalCluster``
            (workers as processes by default; ``None`` lets Dask choose from the CPU
            count). Ignored, and refused if given, when connecting to an address.
        timeout: seconds to wait for the scheduler and for ``min_workers`` workers; also
            how long the client tries to reconnect to a lost scheduler before it gives up.
        min_workers: wait until the scheduler has at least this many workers (a
            computation on a cluster without workers would wait forever).

    Returns:
        The client, set as Dask's default scheduler. Close it (``with connect(...) as
        client:``); a client that started a ``LocalCluster`` closes that cluster too. The
        local cluster's dashboard listens on a random free port (``:0``), so that several
        clusters on one machine do not clash.

    Before the client is made, a first connection must complete Dask's handshake within
    about ``timeout``: a service that accepts connections and never answers, or answers
    in another protocol (an HTTP server, a scheduler's dashboard), is refused then rather
    than waited on forever (distributed puts no timeout on its handshake).

    Raises:
        ClusterError: the scheduler cannot be reached within ``timeout``, what listens at
            the address is not a Dask scheduler, the scheduler file cannot be read or is
            not one, or fewer than ``min_workers`` workers joined it.
        ValueError: bad arguments (a malformed or empty address, cluster options with an
            address).
    """
    distributed = _distributed()
    if not timeout > 0:
        raise ValueError(f"timeout must be positive, got {timeout!r}")
    check_nonnegative_int(min_workers, "min_workers")
    local = address is None or address == LOCAL
    if local:
        for name, value in (("n_workers", n_workers), ("threads_per_worker", threads_per_worker)):
            if value is not None:
                check_positive_int(value, name)
        kwargs: dict[str, Any] = {"processes": processes, "dashboard_address": ":0"}
        if n_workers is not None:
            kwargs["n_workers"] = n_workers
        if threads_per_worker is not None:
            kwargs["threads_per_worker"] = threads_per_worker
        where = "a new LocalCluster"
        try:
            # Client(**kwargs) starts the LocalCluster itself, so client.close() closes it.
            client = distributed.Client(timeout=timeout, **kwargs)
        except (OSError, asyncio.TimeoutError, concurrent.futures.TimeoutError) as exc:
            _close_failed_client(distributed, exc)
            raise ClusterError(f"could not start a local Dask cluster: {exc}") from exc
    else:
        assert address is not None
        if not isinstance(address, str) or not address.strip():
            raise ValueError(f"the scheduler address must be a non-empty string, got {address!r}")
        if n_workers is not None or threads_per_worker is not None:
            raise ValueError(
                "n_workers/threads_per_worker shape a new local cluster; "
                f"they cannot be given with a scheduler address ({address!r})"
            )
        if address.endswith(".json"):
            target = _read_scheduler_file(address)
            where = f"the Dask scheduler at {target!r} (from scheduler file {address!r})"
        else:
            target = address
            where = f"the Dask scheduler at {address!r}"
        unreachable = (
            f"cannot reach {where} within {timeout:g} s "
            "(is a scheduler running there, e.g. `dask scheduler`?)"
        )
        _handshake(distributed, target, timeout, where, unreachable)
        try:
            client = distributed.Client(target, timeout=timeout)
        except ValueError as exc:  # a malformed address: no port, an unknown scheme
            _close_failed_client(distributed, exc)
            raise ValueError(f"invalid Dask scheduler address {target!r}: {exc}") from exc
        except (OSError, asyncio.TimeoutError, concurrent.futures.TimeoutError) as exc:
            _close_failed_client(distributed, exc)
            raise ClusterError(f"{unreachable}: {exc}") from exc
    if min_workers:
        try:
            client.wait_for_workers(min_workers, timeout=timeout)
        except (OSError, asyncio.TimeoutError, concurrent.futures.TimeoutError) as exc:
            have = len(client.scheduler_info(n_workers=-1).get("workers", {}))
            client.close()
            raise ClusterError(
                f"{where} has {have} worker(s) after {timeout:g} s; {min_workers} needed "
                "(start some with `dask worker ADDRESS`)"
            ) from exc
    return client


def _read_scheduler_file(path: str) -> str:
    """The scheduler address that a scheduler file (``dask scheduler --scheduler-file``,
    a JSON object with an ``"address"``) holds; :class:`ClusterError` otherwise."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ClusterError(f"scheduler file {path!r} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ClusterError(f"cannot read scheduler file {path!r}: {exc}") from exc
    try:
        info = json.loads(text)
    except ValueError:
        info = None
    address = info.get("address") if isinstance(info, dict) else None
    if not isinstance(address, str) or not address.strip():
        raise ClusterError(
            f"scheduler file {path!r} is not one that `dask scheduler --scheduler-file` "
            'writes (a JSON object with the scheduler\'s "address")'
        )
    return address


def _handshake(
    distributed: Any, address: str, timeout: float, where: str, unreachable: str
) -> None:
    """Connect to ``address`` and complete Dask's handshake within ``timeout`` seconds
    (plus a grace), then hang up; raise :class:`ClusterError` (``ValueError`` for a
    malformed address) if that fails.

    Runs in a thread of its own with its own event loop, so that it also works when the
    caller runs inside an event loop (a notebook).
    """

    async def shake() -> None:
        comm = await distributed.comm.connect(address, timeout=timeout)
        await comm.close()

    async def bounded() -> None:
        await asyncio.wait_for(shake(), timeout + _HANDSHAKE_GRACE)

    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="dask-handshake") as pool:
        try:
            pool.submit(asyncio.run, bounded()).result()
        except ValueError as exc:  # a malformed address: no port, an unknown scheme
            raise ValueError(f"invalid Dask scheduler address {address!r}: {exc}") from exc
        except (asyncio.TimeoutError, concurrent.futures.TimeoutError) as exc:
            raise ClusterError(
                f"{where} accepted the connection but did not answer as a Dask scheduler "
                f"within {timeout:g} s; is it one?"
            ) from exc
        except OSError as exc:
            raise ClusterError(f"{unreachable}: {exc}") from exc
        except Exception as exc:  # an answer in another protocol read as Dask frames
            raise ClusterError(
                f"{where} answered, but not as a Dask scheduler (its reply is not Dask's "
                "protocol); is the address a scheduler's, not its dashboard's or another "
                "service's?"
            ) from exc


def _close_failed_client(distributed: Any, exc: BaseException) -> None:
    """Close, here and now, the half-started ``Client`` whose constructor raised ``exc``
    (found in the traceback).

    Left alone it is closed by its ``__del__`` whenever the garbage collector gets to it,
    and that close stops the event-loop runner that all clients of the process share: run
    while the next Client starts that runner, it made the start fail (``assert loop is not
    None``) or deadlock on the runner's lock. Once closed here, ``__del__`` does nothing.
    A failure of this close is not reported: the caller raises the connection error.
    """
    for frame, _ in traceback.walk_tb(exc.__traceback__):
        if frame.f_code is distributed.Client.__init__.__code__:
            client = frame.f_locals.get("self")
            if isinstance(client, distributed.Client):
                with contextlib.suppress(Exception):
                    client.close()
            return


def _current_client(client: Any = None) -> Any:
    if client is not None:
        return client
    try:
        distributed = _distributed()
        return distributed.get_client()
    except (ImportError, ValueError):
        return None


def scheduler_address(client: Any = None) -> str | None:
    """The address of ``client``'s scheduler (default: the current default client), or
    ``None`` when no distributed client is active (threaded or synchronous Dask)."""
    client = _current_client(client)
    if client is None or client.scheduler is None:
        return None
    return str(client.scheduler.address)


def _scheduler_lost(client: Any, exc: BaseException) -> bool:
    """Whether ``exc``, raised by a computation on ``client``, means the scheduler went away
    (rather than a task failing with an error of its own)."""
    if getattr(exc, "reason", None) == "scheduler-connection-lost":
        return True
    from distributed.comm.core import CommClosedError

    # A task's own OSError, or a cancellation by the user, arrives while the client is
    # still connected; after a lost scheduler the client is reconnecting or closed.
    lost_kinds = (CommClosedError, concurrent.futures.CancelledError, OSError)
    return isinstance(exc, lost_kinds) and client.status != "running"


@contextmanager
def computing(client: Any = None) -> Iterator[None]:
    """Run a Dask computation inside ``with computing():`` to turn the errors of a lost
    scheduler (cancelled futures, closed connections) into a :class:`ClusterError`
    that names the scheduler. Other errors (a bad document, a failing task) pass through.

    ``client`` defaults to the active distributed client; without one (threaded Dask)
    the context does nothing.
    """
    client = _current_client(client)
    if client is None:
        yield
        return
    address = scheduler_address(client)
    try:
        yield
    except Exception as exc:
        if not _scheduler_lost(client, exc):
            raise
        raise ClusterError(
            f"lost the Dask scheduler at {address} during the computation "
            f"({type(exc).__name__}: {exc}); no result was produced"
        ) from exc
