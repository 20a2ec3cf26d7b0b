"""cluster.connect against addresses that are not Dask schedulers (fake services in threads on
127.0.0.1): each fails fast with one clear ClusterError; real clusters: test_dask_scale.py."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("distributed")

import microgpt_xp as mx
from microgpt_xp.cluster import _WORKER_LOG_LEVEL, ClusterError, connect, quiet
from microgpt_xp.runners import DaskTasks

TIMEOUT = 2.0


@contextmanager
def _serving(answer: bytes | None = None) -> Iterator[str]:
    """The ``tcp://`` address of a service that accepts connections and answers nothing
    (``None``: does not even read), or ``answer`` once the first bytes come."""
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        with contextlib.suppress(OSError):  # the server closed
            while True:
                conn, _ = server.accept()
                with conn:
                    if conn.recv(1):
                        conn.sendall(answer or b"")

    if answer is not None:
        threading.Thread(target=serve, daemon=True).start()
    try:
        yield f"tcp://127.0.0.1:{server.getsockname()[1]}"
    finally:
        with contextlib.suppress(OSError):
            server.shutdown(socket.SHUT_RDWR)  # wakes the accept() of serve
        server.close()


#: What an HTTP server answers a request it cannot parse.
HTTP_400 = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 11\r\n\r\nBad Request"


def _refused(address: str, *phrases: str) -> str:
    """The one-line ClusterError of ``connect(address)``, holding ``phrases``, within
    ``TIMEOUT + 8`` s (in a thread: a hang fails the test)."""
    outcome: list[BaseException] = []

    def attempt() -> None:
        try:
            client = connect(address, timeout=TIMEOUT, min_workers=0)
        except BaseException as exc:
            outcome.append(exc)
        else:
            client.close()
            outcome.append(AssertionError("connected"))

    thread = threading.Thread(target=attempt, daemon=True)
    start = time.monotonic()
    thread.start()
    thread.join(TIMEOUT + 8)
    assert not thread.is_alive(), f"connect() still waiting after {TIMEOUT + 8:g} s"
    assert outcome, "connect() ended without an outcome"
    print(f"connect() ended after {time.monotonic() - start:.2f} s")
    exc = outcome[0]
    assert isinstance(exc, ClusterError), repr(exc)
    assert "\n" not in str(exc) and all(p in str(exc) for p in phrases), str(exc)
    return str(exc)


@pytest.mark.parametrize(
    ("answer", "phrases", "absent"),
    [
        (None, ["did not answer as a Dask scheduler", "2 s"], []),  # silent: within the timeout
        (HTTP_400, ["not as a Dask scheduler"], ["memory", "EiB"]),  # an HTTP server
    ],
    ids=["silent", "http"],
)
def test_a_service_that_is_not_a_dask_scheduler_is_refused(
    answer: bytes | None, phrases: list[str], absent: list[str]
) -> None:
    with _serving(answer) as address:
        message = _refused(address, address, *phrases)
    assert not any(word in message for word in absent), message


@pytest.mark.parametrize(
    "content",
    [b"{not json", b"[1, 2]", b'{"addr": "tcp://127.0.0.1:1"}', b'{"address": 3}', b"\xff\xfe"],
    ids=["not-json", "not-an-object", "no-address", "address-not-a-string", "not-utf8"],
)
def test_a_garbage_scheduler_file_is_one_line(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "scheduler.json"
    path.write_bytes(content)
    _refused(str(path), "scheduler file", str(path))


def test_a_scheduler_file_naming_a_silent_service_names_both(tmp_path: Path) -> None:
    with _serving() as address:
        path = tmp_path / "scheduler.json"
        path.write_text(f'{{"address": "{address}", "type": "Scheduler"}}')
        _refused(str(path), address, str(path), "did not answer")


def test_a_closed_port_is_unreachable_within_the_timeout() -> None:
    with _serving() as address:
        pass  # closed again: nothing listens on that port now
    _refused(address, "cannot reach", address)


def test_a_real_scheduler_still_connects(tmp_path: Path) -> None:
    from distributed import LocalCluster

    with LocalCluster(n_workers=0, processes=False, protocol="tcp", dashboard_address=":0") as c:
        address = c.scheduler_address
        with connect(address, timeout=10, min_workers=0) as client:
            assert client.scheduler.address == address
        path = tmp_path / "scheduler.json"
        path.write_text(f'{{"address": "{address}"}}')
        with connect(str(path), timeout=10, min_workers=0) as client:
            assert client.scheduler.address == address


def _fails(params: Any, rows: Any) -> None:
    raise ValueError(f"a bad chunk of {len(rows)} rows")


def test_quiet_silences_distributed_then_restores_it(capfd: pytest.CaptureFixture[str]) -> None:
    """Under quiet() a failing task is its own error alone, no logs; after it, all restored."""
    names = ("distributed", "distributed.client", "distributed.worker", "asyncio", "tornado")
    before = [logging.getLogger(n).getEffectiveLevel() for n in names]
    env = os.environ.get(_WORKER_LOG_LEVEL)
    params = mx.init_params(mx.GPTConfig(5, n_embd=4, n_head=2, n_layer=1, block_size=4))
    with quiet(), connect(n_workers=1, processes=False, timeout=30):
        assert not any(logging.getLogger(n).isEnabledFor(logging.ERROR) for n in names)
        assert os.environ[_WORKER_LOG_LEVEL] == "critical"
        with warnings.catch_warnings(record=True) as seen:
            warnings.warn("Sending large graph of size 9 MiB", UserWarning, stacklevel=1)
            warnings.warn("another warning", UserWarning, stacklevel=1)
        assert [str(w.message) for w in seen] == ["another warning"]
        with pytest.raises(ValueError, match="a bad chunk of 2 rows"):
            DaskTasks(chunk_size=2).map(_fails, params, [np.arange(6)])
    assert "Compute Failed" not in capfd.readouterr().err
    assert [logging.getLogger(n).getEffectiveLevel() for n in names] == before
    assert os.environ.get(_WORKER_LOG_LEVEL) == env
