"""Atomic checkpoints: params, Adam state, step, config and tokenizer in one file.

The file is a NumPy ``.npz`` archive: the weights and Adam moments as arrays, and a
JSON header (format version, config, tokenizer, step, Adam hyperparameters and a
SHA-256 of every array) so that a truncated, corrupt or mismatched file is refused.
"""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import _xp
from ._files import atomic_write
from .config import GPTConfig
from .data import Tokenizer
from .optim import Adam
from .params import FIELDS, Params, from_host, materialize

FORMAT = "microgpt-xp-checkpoint"
VERSION = 1


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
    mid-save leaves the previous file intact, and the temporary files of earlier crashed
    saves of ``path`` are removed. Returns the path.
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
    header = {
        "format": FORMAT,
        "version": VERSION,
        "config": params.config.to_dict(),
        "dtype": str(arrays["params/wte"].dtype),
        "step": int(step),
        "adam": None if adam is None else adam.state_dict(),
        "tokenizer": None if tokenizer is None else tokenizer.to_dict(),
        "meta": meta or {},
        "sha256": {k: _digest(v) for k, v in arrays.items()},
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

    Raises :class:`CheckpointError` for a missing, truncated or corrupt file (every array
    and the header carry a SHA-256, so a damaged byte anywhere is found), a file that is
    not a microgpt-xp checkpoint, non-finite weights, and (when ``config`` is given) a
    config mismatch.
    """
    path = Path(path)
    name = str(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {name!r} does not exist")
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != b"PK\x03\x04":
        raise CheckpointError(f"{name!r} is not a microgpt-xp checkpoint (not an .npz archive)")
    try:
        with np.load(path, allow_pickle=False) as z:
            data = {k: z[k] for k in z.files}
    except Exception as exc:  # zipfile and the zip codecs raise many kinds on damage
        raise CheckpointError(f"checkpoint {name!r} is corrupt or truncated: {exc!r}") from exc
    header = _header(data, name)
    try:
        return _from_header(header, data, name, backend, device, dtype, config)
    except CheckpointError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        # a header that passed its checksum but does not describe a valid checkpoint
        raise CheckpointError(f"checkpoint {name!r} has an invalid header: {exc}") from exc


def _header(data: dict[str, np.ndarray], name: str) -> dict[str, Any]:
    """The checked JSON header (its SHA-256 and every array's), popped from ``data``."""
    try:
        raw = data.pop("__header__").tobytes()
        header = json.loads(raw.decode())
    except (KeyError, ValueError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{name!r} is not a microgpt-xp checkpoint (no valid header)") from exc
    stored = data.pop("__header_sha256__", None)
    if stored is not None and stored.tobytes().decode(errors="replace") != hashlib.sha256(
        raw
    ).hexdigest():
        raise CheckpointError(f"checkpoint {name!r} is corrupt: its header fails its checksum")
    if not isinstance(header, dict):
        raise CheckpointError(
            f"{name!r} is not a microgpt-xp checkpoint (its header is not a mapping)"
        )
    if header.get("format") != FORMAT or header.get("version") != VERSION:
        raise CheckpointError(
            f"{name!r} is not a version-{VERSION} microgpt-xp checkpoint "
            f"(format {header.get('format')!r}, version {header.get('version')!r})"
        )
    missing = [k for k in _REQUIRED if k not in header]
    if missing:
        raise CheckpointError(f"checkpoint {name!r} has a damaged header: missing {missing}")
    digests = header["sha256"]
    if not isinstance(digests, dict) or set(digests) != set(data):
        raise CheckpointError(f"checkpoint {name!r} is incomplete: arrays do not match its header")
    for k, a in data.items():
        if _digest(a) != digests[k]:
            raise CheckpointError(f"checkpoint {name!r} is corrupt: array {k!r} fails its checksum")
    return header


_REQUIRED = ("sha256", "config", "dtype", "step", "adam", "tokenizer", "meta")


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
