"""Atomic checkpoints: params, Adam state, step, config and tokenizer in one file.

The file is a NumPy ``.npz`` archive (a zip of ``.npy`` members): the weights and Adam
moments as arrays, a JSON header (``__header__``) and the SHA-256 of that header
(``__header_sha256__``). The header holds the format version, config, tokenizer, step,
Adam hyperparameters and, for every array, its dtype with byte order, its shape and the
SHA-256 of its bytes, so that a truncated, corrupt, reinterpreted or mismatched file is
refused.

Format versions: 2 (written since the record of each array's dtype and shape) and 1
(read still: its header holds one dtype name for every array and the config that fixes
their shapes, so the same checks apply; only the layout of the header differs).
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from . import _xp
from ._files import atomic_write
from .config import GPTConfig
from .data import Tokenizer
from .optim import Adam
from .params import FIELDS, Params, field_shapes, from_host, materialize

FORMAT = "microgpt-xp-checkpoint"
VERSION = 2
#: The format versions :func:`load` reads.
READS = (1, 2)

#: The largest header :func:`load` inflates (config, tokenizer and meta are far smaller).
MAX_HEADER_BYTES = 64 << 20
#: Room for an ``.npy`` member's own header, before its data.
_NPY_HEADER_BYTES = 1 << 16
_SHA256_HEX = 64


class CheckpointError(ValueError):
    """A checkpoint file that cannot be loaded (missing, corrupt, truncated, mismatched)."""


@dataclass
class Checkpoint:
    """What :func:`load` returns.

    ``params`` on the requested backend; ``adam`` an :class:`Adam` carrying the saved
    moments and step count (``None`` if none was saved); ``step`` the number of training
    steps taken; ``tokenizer`` (or ``None``); ``meta`` extra JSON-able information.
    """

    params: Params
    adam: Adam | None
    step: int
    tokenizer: Tokenizer | None
    meta: dict[str, Any]

    @property
    def config(self) -> GPTConfig:
        """The model config."""
        return self.params.config


class _Record(NamedTuple):
    """What the header says of one array: ``dtype`` as ``numpy.dtype.str`` (byte order
    included, e.g. ``'<f8'``), ``shape`` and the SHA-256 of its C-order bytes."""

    dtype: str
    shape: tuple[int, ...]
    sha256: str

    @property
    def nbytes(self) -> int:
        return int(np.dtype(self.dtype).itemsize * np.prod(self.shape, dtype=np.int64))


def _digest(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def save(
    path: str | Path,
    params: Params,
    *,
    adam: Adam | None = None,
    step: int = 0,
    tokenizer: Tokenizer | None = None,
    meta: dict[str, Any] | None = None,
) -> Path:
    """Write a checkpoint atomically (:func:`microgpt_xp._files.atomic_write`): a crash
    mid-save leaves the previous file intact, and the temporary files that crashed saves
    of ``path`` left are removed (those of saves in flight in other processes are not).
    Returns the path.

    Raises ``TypeError`` for weights or moments that are not float32 or float64 (what
    :func:`load` reads).
    """
    path = Path(path)
    # one computation for lazy (Dask) records instead of one per array
    params, *moments = materialize(params, *([] if adam is None else [adam.m, adam.v]))
    arrays: dict[str, np.ndarray] = {
        f"params/{k}": _xp.to_numpy(v) for k, v in params.arrays().items()
    }
    if adam is not None:
        arrays.update({f"adam_m/{k}": _xp.to_numpy(v) for k, v in moments[0].arrays().items()})
        arrays.update({f"adam_v/{k}": _xp.to_numpy(v) for k, v in moments[1].arrays().items()})
    dtypes = sorted({a.dtype.name for a in arrays.values()})
    if len(dtypes) != 1 or dtypes[0] not in _xp.DTYPES:
        raise TypeError(
            f"a checkpoint holds float32 or float64 weights and moments of one dtype, not "
            f"{', '.join(dtypes)}; convert them first (params.to(dtype='float32'))"
        )
    header = {
        "format": FORMAT,
        "version": VERSION,
        "config": params.config.to_dict(),
        "dtype": dtypes[0],
        "step": int(step),
        "adam": None if adam is None else adam.state_dict(),
        "tokenizer": None if tokenizer is None else tokenizer.to_dict(),
        "meta": meta or {},
        "arrays": {
            k: {"dtype": a.dtype.str, "shape": list(a.shape), "sha256": _digest(a)}
            for k, a in arrays.items()
        },
    }
    raw = json.dumps(header).encode()
    buf = io.BytesIO()
    np.savez(
        buf,
        __header__=np.frombuffer(raw, dtype=np.uint8),
        __header_sha256__=np.frombuffer(hashlib.sha256(raw).hexdigest().encode(), dtype=np.uint8),
        **arrays,  # type: ignore[arg-type]
    )
    return atomic_write(path, buf.getvalue())


def load(
    path: str | Path,
    *,
    backend: str = "numpy",
    device: Any = None,
    dtype: str | None = None,
    config: GPTConfig | None = None,
) -> Checkpoint:
    """Read a checkpoint onto ``backend``/``device`` (``dtype=None``: the saved dtype).

    Raises :class:`CheckpointError` for a missing, truncated or corrupt file, a file that
    is not a microgpt-xp checkpoint (or of a format version this release does not read),
    non-finite weights, and (when ``config`` is given) a config mismatch. Every check is
    made before the weights are used: the header must match its SHA-256; the archive's
    members must be the arrays the header lists, none declaring more bytes than the
    header's record of it needs (so nothing is inflated beyond what the header says,
    however small the file); each array's stored dtype, byte order and shape must be the
    header's record of it, and its bytes must match their SHA-256.
    """
    path = Path(path)
    name = str(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {name!r} does not exist")
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != b"PK\x03\x04":
        raise CheckpointError(f"{name!r} is not a microgpt-xp checkpoint (not an .npz archive)")
    with _reading(name):
        archive = zipfile.ZipFile(path)
    with archive:
        infos = archive.infolist()
        members = {i.filename: i for i in infos}
        if len(members) != len(infos):
            raise CheckpointError(f"checkpoint {name!r} is corrupt: a member appears twice")
        with _reading(name):
            raw = _member_bytes(archive, members.get("__header__.npy"), MAX_HEADER_BYTES, name)
            checksum = members.get("__header_sha256__.npy")
            stored = _member_bytes(archive, checksum, _SHA256_HEX, name)
        header = _header(raw, stored, name)
        try:
            table = _table(header)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CheckpointError(f"checkpoint {name!r} has an invalid header: {exc}") from exc
        _check_members(members, table, name)
        data = {}
        for k, rec in table.items():
            with _reading(name):
                data[k] = _member_array(archive, members[f"{k}.npy"], k, rec, name)
            if _digest(data[k]) != rec.sha256:
                raise CheckpointError(
                    f"checkpoint {name!r} is corrupt: array {k!r} fails its checksum"
                )
    try:
        return _from_header(header, data, name, backend, device, dtype, config)
    except CheckpointError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        # a header that passed its checksum but does not describe a valid checkpoint
        raise CheckpointError(f"checkpoint {name!r} has an invalid header: {exc}") from exc


@contextmanager
def _reading(name: str) -> Iterator[None]:
    """Turn the errors of reading a damaged archive into one :class:`CheckpointError`."""
    try:
        yield
    except CheckpointError:
        raise
    except Exception as exc:  # zipfile, zlib and the .npy reader raise many kinds on damage
        raise CheckpointError(f"checkpoint {name!r} is corrupt or truncated: {exc!r}") from exc


def _npy_header(f: Any, info: zipfile.ZipInfo) -> tuple[tuple[int, ...], bool, np.dtype[Any]]:
    """``(shape, fortran_order, dtype)`` from the start of an ``.npy`` member."""
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        return np.lib.format.read_array_header_1_0(f)  # type: ignore[no-any-return]
    if version == (2, 0):
        return np.lib.format.read_array_header_2_0(f)  # type: ignore[no-any-return]
    raise ValueError(f"member {info.filename!r} has .npy format version {version}")


def _member_bytes(
    archive: zipfile.ZipFile, info: zipfile.ZipInfo | None, limit: int, name: str
) -> bytes | None:
    """The bytes of a 1-d uint8 member of at most ``limit`` bytes (``None`` if absent)."""
    if info is None:
        return None
    if info.file_size > limit + _NPY_HEADER_BYTES:
        raise CheckpointError(
            f"checkpoint {name!r} is corrupt: member {info.filename!r} declares a size of "
            f"{info.file_size} bytes, more than the {limit} bytes it may hold"
        )
    with archive.open(info) as f:
        shape, _, dtype = _npy_header(f, info)
        if dtype != np.uint8 or len(shape) != 1:
            raise ValueError(f"member {info.filename!r} is not a byte string")
        raw = f.read()  # bounded by the declared size; reading to the end checks the CRC
    if len(raw) != shape[0]:
        raise ValueError(f"member {info.filename!r} holds {len(raw)} bytes, not {shape[0]}")
    return raw


def _member_array(
    archive: zipfile.ZipFile, info: zipfile.ZipInfo, key: str, rec: _Record, name: str
) -> np.ndarray:
    """The array of a member, once its stored dtype and shape are found to be ``rec``'s."""
    with archive.open(info) as f:
        shape, fortran, dtype = _npy_header(f, info)
        if dtype.str != rec.dtype or tuple(shape) != rec.shape:
            raise CheckpointError(
                f"checkpoint {name!r} is corrupt: array {key!r} is stored as {dtype.str} "
                f"{tuple(shape)}, and its header says {rec.dtype} {rec.shape}"
            )
        # bounded by the declared size (checked); reading to the end checks the CRC
        buf = bytearray(f.read())  # writable, as np.load's arrays are
    if len(buf) != rec.nbytes:
        raise ValueError(f"array {key!r} holds {len(buf)} bytes, not {rec.nbytes}")
    a = np.frombuffer(buf, dtype=dtype)
    return a.reshape(shape[::-1]).T if fortran else a.reshape(shape)


def _header(raw: bytes | None, stored: bytes | None, name: str) -> dict[str, Any]:
    """The checked JSON header: its format, SHA-256 (which must be there) and version."""
    not_ours = f"{name!r} is not a microgpt-xp checkpoint (no valid header)"
    if raw is None:
        raise CheckpointError(not_ours)
    try:
        header = json.loads(raw.decode())
    except (ValueError, UnicodeDecodeError) as exc:
        raise CheckpointError(not_ours) from exc
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise CheckpointError(
            f"{name!r} is not a microgpt-xp checkpoint (its header names no microgpt-xp format)"
        )
    if stored is None:
        raise CheckpointError(f"checkpoint {name!r} is corrupt: it has no header checksum")
    if stored.decode(errors="replace") != hashlib.sha256(raw).hexdigest():
        raise CheckpointError(f"checkpoint {name!r} is corrupt: its header fails its checksum")
    version = header.get("version")
    if version not in READS:
        raise CheckpointError(
            f"checkpoint {name!r} has format version {version!r}; this microgpt-xp reads "
            f"versions {', '.join(map(str, READS))} (was it written by a newer release?)"
        )
    missing = [k for k in (*_REQUIRED, "sha256" if version == 1 else "arrays") if k not in header]
    if missing:
        raise CheckpointError(f"checkpoint {name!r} has a damaged header: missing {missing}")
    return header


_REQUIRED = ("config", "dtype", "step", "adam", "tokenizer", "meta")


def _table(header: dict[str, Any]) -> dict[str, _Record]:
    """The header's record of every array, checked against its config and dtype (for
    version 1, built from them and its SHA-256 per array)."""
    config = GPTConfig.from_dict(header["config"])
    shapes = field_shapes(config)
    dtype = np.dtype(_xp.check_dtype(header["dtype"]))
    prefixes = ["params"] if header["adam"] is None else ["params", "adam_m", "adam_v"]
    want = {f"{p}/{f}": shapes[f] for p in prefixes for f in FIELDS}
    if header["version"] == 1:
        listed = {
            k: {"dtype": dtype.str, "shape": want.get(k), "sha256": v}
            for k, v in header["sha256"].items()
        }
    else:
        listed = header["arrays"]
    if set(listed) != set(want):
        raise ValueError(f"it lists arrays {sorted(listed)}, its config needs {sorted(want)}")
    table = {}
    for k, rec in listed.items():
        r = _Record(str(rec["dtype"]), tuple(int(n) for n in rec["shape"]), str(rec["sha256"]))
        if np.dtype(r.dtype).name != dtype.name or r.shape != want[k]:
            raise ValueError(
                f"array {k!r} is recorded as {r.dtype} {r.shape}; its config and dtype need "
                f"{dtype.name} {want[k]}"
            )
        table[k] = r
    return table


def _check_members(
    members: dict[str, zipfile.ZipInfo], table: dict[str, _Record], name: str
) -> None:
    """The archive holds exactly the header's arrays, none declaring more bytes than its
    record needs (checked before any is inflated)."""
    listed = {f"{k}.npy" for k in table}
    have = set(members) - {"__header__.npy", "__header_sha256__.npy"}
    if have != listed:
        raise CheckpointError(
            f"checkpoint {name!r} is incomplete: arrays do not match its header (missing "
            f"{sorted(listed - have)}, unexpected {sorted(have - listed)})"
        )
    for k, rec in table.items():
        size = members[f"{k}.npy"].file_size
        if not rec.nbytes <= size <= rec.nbytes + _NPY_HEADER_BYTES:
            raise CheckpointError(
                f"checkpoint {name!r} is corrupt: member {k!r} declares a size of {size} "
                f"bytes, and its header's record ({rec.dtype} {rec.shape}) needs {rec.nbytes} "
                "bytes of data"
            )


def _from_header(
    header: dict[str, Any],
    data: dict[str, np.ndarray],
    name: str,
    backend: str,
    device: Any,
    dtype: str | None,
    config: GPTConfig | None,
) -> Checkpoint:
    """The :class:`Checkpoint` that a checked header and its arrays describe."""
    try:
        saved = GPTConfig.from_dict(header["config"])
    except (TypeError, ValueError, AttributeError) as exc:
        raise CheckpointError(f"checkpoint {name!r} has an invalid config: {exc}") from exc
    if config is not None and config != saved:
        raise CheckpointError(f"checkpoint {name!r} holds {saved}, not the requested {config}")
    dtype = header["dtype"] if dtype is None else _xp.check_dtype(dtype)

    def record(prefix: str) -> Params:
        host = {k: data[f"{prefix}/{k}"] for k in FIELDS}
        bad = [k for k, a in host.items() if not np.isfinite(a).all()]
        if bad:
            raise CheckpointError(f"checkpoint {name!r} holds non-finite values in {prefix}/{bad}")
        try:
            return from_host(host, saved, backend=backend, device=device, dtype=dtype)
        except ValueError as exc:
            raise CheckpointError(f"checkpoint {name!r} does not match its config: {exc}") from exc

    params = record("params")
    adam = None
    if header["adam"] is not None:
        hp = dict(header["adam"])
        t = hp.pop("t")
        adam = Adam(params, **hp)
        adam.m, adam.v, adam.t = record("adam_m"), record("adam_v"), t
    tok = header["tokenizer"]
    step = header["step"]
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise CheckpointError(f"checkpoint {name!r} has an invalid step {step!r}")
    return Checkpoint(
        params=params,
        adam=adam,
        step=step,
        tokenizer=None if tok is None else Tokenizer.from_dict(tok),
        meta=header["meta"],
    )
