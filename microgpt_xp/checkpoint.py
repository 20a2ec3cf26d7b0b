"""Atomic checkpoints: one ``.npz`` of ``.npy`` arrays (weights, Adam's moments), a JSON header
(``__header__``: config, dtype, step, Adam, tokenizer, meta, each array's dtype, shape and
SHA-256) and its SHA-256 (``__header_sha256__``); version 1 (still read) had no shapes."""

from __future__ import annotations

import hashlib
import io
import json
import math
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from . import _xp
from ._files import atomic_write
from .config import GPTConfig
from .data import Tokenizer
from .optim import Adam, AdamConfig
from .params import FIELDS, Params, check_placement, field_shapes, from_host, materialize

FORMAT = "microgpt-xp-checkpoint"
VERSION = 2
#: The format versions :func:`load` reads.
READS = (1, 2)
#: The largest header :func:`load` inflates (config, tokenizer and meta are far smaller).
MAX_HEADER_BYTES = 64 << 20
_NPY_HEADER_BYTES = 1 << 16  # room for an .npy member's own header, before its data
_HEADERS = ("__header__.npy", "__header_sha256__.npy")
_PREFIXES = ("params", "adam_m", "adam_v")


class CheckpointError(ValueError):
    """A checkpoint file that cannot be loaded (missing, corrupt, truncated, mismatched)."""


@dataclass
class Checkpoint:
    """What :func:`load` returns: ``params``, ``adam`` (with the saved moments and step
    count, or ``None``), ``step`` (training steps), ``tokenizer`` (or ``None``), ``meta``."""

    params: Params
    adam: Adam | None
    step: int
    tokenizer: Tokenizer | None
    meta: dict[str, Any]

    @property
    def config(self) -> GPTConfig:
        """The model config."""
        return self.params.config

    @property
    def mode(self) -> str:
        """What the run trained on: ``"text"`` (a stream) or ``"docs"`` (also for older files)."""
        run = self.meta.get("run") if isinstance(self.meta, dict) else None
        return run.get("mode", "docs") if isinstance(run, dict) else "docs"


class _Record(NamedTuple):  # one array as the header lists it
    dtype: str  # numpy.dtype.str, e.g. '<f8'
    shape: tuple[int, ...]
    sha256: str


_Hp = tuple[AdamConfig, int] | None  # Adam's config and step, if the file has them


def _digest(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def _corrupt(name: str, why: str) -> CheckpointError:
    return CheckpointError(f"checkpoint {name} is corrupt: {why}")


def save(
    path: str | Path,
    params: Params,
    *,
    adam: Adam | None = None,
    step: int = 0,
    tokenizer: Tokenizer | None = None,
    meta: dict[str, Any] | None = None,
) -> Path:
    """Write a checkpoint atomically (a crash mid-save leaves the previous file) and return
    its path; ``TypeError`` unless weights and moments are all float32 or all float64."""
    records = materialize(*([params] if adam is None else [params, adam.m, adam.v]))
    arrays = {
        f"{prefix}/{k}": _xp.to_numpy(a)
        for prefix, record in zip(_PREFIXES, records, strict=False)
        for k, a in record.arrays().items()
    }
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
    digest = hashlib.sha256(raw).hexdigest().encode()
    entries = {
        "__header__": np.frombuffer(raw, dtype=np.uint8),
        "__header_sha256__": np.frombuffer(digest, dtype=np.uint8),
        **arrays,
    }
    blobs: dict[str, bytes] = {}
    for name, a in entries.items():  # each in the .npy format: the slow part, outside the zip
        f = io.BytesIO()
        np.lib.format.write_array(f, a, allow_pickle=False)
        blobs[name] = f.getvalue()
    buf = io.BytesIO()
    archive = zipfile.ZipFile(buf, "w")  # np.savez's layout, each entry written whole
    try:
        for name, blob in blobs.items():
            archive.writestr(f"{name}.npy", blob)
    except BaseException:
        # the buffer is dropped: no close(), whose "open writing handle" ValueError would
        # replace a Ctrl-C that lands inside an entry, and again at exit from __del__
        archive.fp = None
        raise
    archive.close()
    return atomic_write(Path(path), buf.getvalue())


def load(
    path: str | Path,
    *,
    backend: str = "numpy",
    device: Any = None,
    dtype: str | None = None,
    config: GPTConfig | None = None,
) -> Checkpoint:
    """Read a checkpoint onto ``backend``/``device`` (``dtype=None``: the saved dtype): an
    ``ArgumentValueError`` for a bad one of those; :class:`CheckpointError` for a missing,
    damaged or foreign file, non-finite weights or a config other than ``config``;
    ``MemoryError`` for a valid file too large for this machine."""
    check_placement(backend, device, dtype)
    name = repr(str(path))
    try:
        header, saved, hp, tokenizer, data = _read_file(Path(path), name, config)
        records = [
            from_host(
                {k: data[f"{prefix}/{k}"] for k in FIELDS},
                saved,
                backend=backend,
                device=device,
                dtype=header["dtype"] if dtype is None else dtype,
            )
            for prefix in _PREFIXES[: 1 if hp is None else 3]
        ]
    except MemoryError as exc:  # a valid file too large for this machine is not corrupt
        raise MemoryError(
            f"checkpoint {name} does not fit in this machine's memory (it is not corrupt): "
            "free memory, or load it where there is more"
        ) from exc
    adam = None
    if hp is not None:
        adam = Adam(records[0], hp[0])
        adam.restore(records[1], records[2], hp[1])
    return Checkpoint(records[0], adam, header["step"], tokenizer, header["meta"])


class Header(NamedTuple):
    """What :func:`peek` returns: a checkpoint's ``config``, ``tokenizer``, ``step``, ``meta``."""

    config: GPTConfig
    tokenizer: Tokenizer | None
    step: int
    meta: dict[str, Any]


def peek(path: str | Path) -> Header:
    """A checkpoint's header without its arrays (none read): what a run needs to know before
    :func:`load`; the same checks of the header, the same :class:`CheckpointError`."""
    header, config, _, tokenizer, _ = _read_file(Path(path), repr(str(path)), None, arrays=False)
    return Header(config, tokenizer, header["step"], header["meta"])


def _read_file(
    path: Path, name: str, config: GPTConfig | None, arrays: bool = True
) -> tuple[dict[str, Any], GPTConfig, _Hp, Tokenizer | None, dict[str, Any]]:
    """``(header, config, (Adam's config, step) or None, tokenizer, arrays)`` of a checkpoint:
    the header against its SHA-256, each array's declared size before it is inflated, then its
    dtype, shape and SHA-256 against the header (``arrays=False``: none read, ``{}``)."""
    if not path.is_file():
        raise CheckpointError(f"checkpoint {name} does not exist")
    with path.open("rb") as f:
        if f.read(4) != b"PK\x03\x04":
            raise CheckpointError(f"{name} is not a microgpt-xp checkpoint (not an .npz archive)")
    try:
        with zipfile.ZipFile(path) as archive:
            infos = archive.infolist()
            members = {i.filename: i for i in infos}
            if len(members) != len(infos):
                raise _corrupt(name, "a member appears twice")
            raw, stored = (
                _read(archive, members[k], name, None, most).tobytes() if k in members else None
                for k, most in zip(_HEADERS, (MAX_HEADER_BYTES, 64), strict=True)
            )
            header, saved, table, hp, tokenizer = _header(raw, stored, name)
            if config is not None and config != saved:
                raise CheckpointError(
                    f"checkpoint {name} holds {saved}, not the requested {config}"
                )
            listed, have = {f"{k}.npy" for k in table}, set(members) - set(_HEADERS)
            if have != listed:
                raise CheckpointError(
                    f"checkpoint {name} is incomplete: arrays do not match its header (missing "
                    f"{sorted(listed - have)}, unexpected {sorted(have - listed)})"
                )
            read = table.items() if arrays else ()
            data = {k: _read(archive, members[f"{k}.npy"], name, r) for k, r in read}
    except (CheckpointError, MemoryError):
        raise
    except Exception as exc:  # zipfile, zlib and the .npy reader raise many kinds on damage
        raise CheckpointError(f"checkpoint {name} is corrupt or truncated: {exc!r}") from exc
    bad = [k for k, a in data.items() if _digest(a) != table[k].sha256]
    if bad:
        raise _corrupt(name, f"array {bad[0]!r} fails its checksum")
    bad = [k for k, a in data.items() if not np.isfinite(a).all()]
    if bad:
        raise CheckpointError(f"checkpoint {name} holds non-finite values in {bad}")
    return header, saved, hp, tokenizer, data


def _read(
    archive: zipfile.ZipFile, info: zipfile.ZipInfo, name: str, rec: _Record | None, most: int = 0
) -> np.ndarray:
    """A member's array once its declared size, dtype and shape are ``rec``'s; without
    ``rec``, a byte string of at most ``most`` bytes."""
    if rec is not None:
        most = np.dtype(rec.dtype).itemsize * math.prod(rec.shape)
    least = 0 if rec is None else most
    if not least <= info.file_size <= most + _NPY_HEADER_BYTES:
        raise _corrupt(
            name, f"member {info.filename!r} declares {info.file_size} bytes, for {least} to {most}"
        )
    with archive.open(info) as f:
        version = np.lib.format.read_magic(f)
        if version not in ((1, 0), (2, 0)):
            raise ValueError(f"member {info.filename!r} has .npy format version {version}")
        shape, fortran, dtype = getattr(np.lib.format, f"read_array_header_{version[0]}_0")(f)
        if rec is None:
            if dtype != np.uint8 or len(shape) != 1:
                raise ValueError(f"member {info.filename!r} is not a byte string")
        elif dtype.str != rec.dtype or tuple(shape) != rec.shape:
            why = f"{dtype.str} {tuple(shape)}, and its header says {rec.dtype} {rec.shape}"
            raise _corrupt(name, f"array {info.filename[:-4]!r} is stored as {why}")
        buf = bytearray(f.read())  # bounded by the declared size; the end checks the CRC
    if len(buf) != dtype.itemsize * math.prod(shape):
        raise ValueError(f"member {info.filename!r} is shorter or longer than its shape {shape}")
    a = np.frombuffer(buf, dtype=dtype)
    return a.reshape(shape[::-1]).T if fortran else a.reshape(shape)  # type: ignore[no-any-return]


def _header(
    raw: bytes | None, stored: bytes | None, name: str
) -> tuple[dict[str, Any], GPTConfig, dict[str, _Record], _Hp, Tokenizer | None]:
    """``(header, config, records, (Adam's config, step) or None, tokenizer)`` of the JSON
    header, once its format, SHA-256 (which must be there), version and content pass."""
    not_ours = f"{name} is not a microgpt-xp checkpoint"
    try:
        header = json.loads(raw.decode()) if raw is not None else None
    except ValueError as exc:  # UnicodeDecodeError included
        raise CheckpointError(f"{not_ours} (no valid header)") from exc
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise CheckpointError(f"{not_ours} (its header names no microgpt-xp format)")
    if stored is None:
        raise _corrupt(name, "it has no header checksum")
    if stored.decode(errors="replace") != hashlib.sha256(raw).hexdigest():  # type: ignore[arg-type]
        raise _corrupt(name, "its header fails its checksum")
    if header.get("version") not in READS:
        raise CheckpointError(
            f"checkpoint {name} has format version {header.get('version')!r}; this microgpt-xp "
            f"reads versions {', '.join(map(str, READS))} (was it written by a newer release?)"
        )
    try:
        config = GPTConfig.from_dict(header["config"])
        shapes = field_shapes(config)
        dtype = np.dtype(_xp.check_dtype(header["dtype"]))
        prefixes = _PREFIXES[: 1 if header["adam"] is None else 3]
        want = {f"{p}/{f}": shapes[f] for p in prefixes for f in FIELDS}
        if header["version"] == 1:  # a SHA-256 per array; the dtype and config imply the rest
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
                    f"array {k!r} is recorded as {r.dtype} {r.shape}; its config and dtype "
                    f"need {dtype.name} {want[k]}"
                )
            table[k] = r
        hp = None
        if header["adam"] is not None:
            adam = dict(header["adam"])
            t = adam.pop("t")
            hp = AdamConfig(**adam), t
            _count("Adam's step", t, hp[0].num_steps)
        _count("step", header["step"], math.inf)
        tok = header["tokenizer"]
        return header, config, table, hp, None if tok is None else Tokenizer.from_dict(tok)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        why = f"no {exc}" if isinstance(exc, KeyError) else str(exc)
        raise CheckpointError(f"checkpoint {name} has an invalid header: {why}") from exc


def _count(what: str, value: Any, most: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= most:
        raise ValueError(f"invalid {what} {value!r}")
