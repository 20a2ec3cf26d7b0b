"""A ``dask.distributed`` client with one-line errors (the ``dask`` extra): :func:`connect`,
:func:`computing` for a lost scheduler, :func:`quiet` for distributed's logs."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import gc
import json
import logging
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ._backends import install_extra
from ._errors import ArgumentValueError
from ._xp import check_nonnegative_int, check_positive_int

LOCAL = "local"  # the address that starts a LocalCluster on this machine
_TIMEOUTS = (OSError, asyncio.TimeoutError, concurrent.futures.TimeoutError)
_WORKER_LOG_LEVEL = "DASK_LOGGING__DISTRIBUTED"  # the level of workers started during quiet()


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
    """A ``distributed.Client`` for ``address`` (``"tcp://host:8786"``, ``"host:8786"``, a
    scheduler file ``.json``, or ``None``/``"local"``: a new ``LocalCluster`` of ``n_workers``,
    ``threads_per_worker``, ``processes``) within ``timeout`` s, else :class:`ClusterError`."""
    distributed = _distributed()
    if not timeout > 0:
        raise ArgumentValueError("timeout", f"timeout must be positive, got {timeout!r}")
    check_nonnegative_int(min_workers, "min_workers")
    target, kwargs, where = None, {}, "a new LocalCluster"
    if address is None or address == LOCAL:
        shape = {"n_workers": n_workers, "threads_per_worker": threads_per_worker}
        shape = {k: check_positive_int(v, k) for k, v in shape.items() if v is not None}
        kwargs = {"processes": processes, "dashboard_address": ":0", **shape}
    elif not isinstance(address, str) or not address.strip():
        raise ArgumentValueError("address", f"address must be a non-empty string, got {address!r}")
    elif n_workers is not None or threads_per_worker is not None:
        msg = f"n_workers/threads_per_worker cannot be given with a scheduler address ({address!r})"
        raise ArgumentValueError("n_workers", msg)
    else:
        target, where = address, f"the Dask scheduler at {address!r}"
        if address.endswith(".json"):
            target = _read_scheduler_file(address)
            where = f"the Dask scheduler at {target!r} (from scheduler file {address!r})"
        _handshake(distributed, target, timeout, where)
    try:
        client = _client_class()(target, timeout=timeout, **kwargs)
    except _TIMEOUTS as exc:
        if target is None:
            raise ClusterError(f"could not start a local Dask cluster: {exc}") from exc
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


@functools.cache
def _client_class() -> type:
    class Client(_distributed().Client):  # type: ignore[misc,name-defined]
        """Closed at once when its start fails (``__del__``'s close could stop the shared loop)."""

        def start(self, **kwargs: Any) -> Any:
            try:
                return super().start(**kwargs)
            except BaseException:
                with contextlib.suppress(Exception):
                    self.close()
                raise

    return Client


def _read_scheduler_file(path: str) -> str:
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
    """Dask's handshake with ``address`` within ``timeout`` + 1 s, on a thread of its own."""

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


@contextlib.contextmanager
def computing(client: Any = None) -> Iterator[None]:
    """A lost scheduler's errors in the block as :class:`ClusterError` (``client``: the active
    one by default)."""
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


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Silence distributed's, tornado's, asyncio's and bokeh's loggers (and new workers') and
    the "large graph" warning in the block."""
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
