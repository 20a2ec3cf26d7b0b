"""Tests of microgpt_xp.checkpoint: lossless round trips, atomic saves and clear refusals of
files that are missing, truncated, corrupt, foreign or of another model."""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from xp_testing import assert_params_equal, xp_assert_close

from microgpt_xp import GPTConfig, Params, init_params, loss_and_grads
from microgpt_xp.checkpoint import CheckpointError, load, save
from microgpt_xp.data import Tokenizer, encode_docs
from microgpt_xp.optim import Adam
from microgpt_xp.params import materialize
from microgpt_xp.train import to_batch

DOCS = ["abca", "bc", "cabbac", "a"]
TOKENIZER = Tokenizer.from_docs(DOCS)
CONFIG = GPTConfig(vocab_size=TOKENIZER.vocab_size, n_layer=2, n_embd=8, n_head=2, block_size=6)


def _host(p: Params) -> dict[str, np.ndarray]:
    return {k: np.asarray(p.to("numpy").arrays()[k]) for k in p.arrays()}


def _trained(
    name: str = "numpy", device: Any = None, dtype: str = "float64", steps: int = 2
) -> tuple[Params, Adam]:
    """Params and an Adam whose moments are non-zero (a couple of real updates)."""
    params = init_params(CONFIG, seed=3, backend=name, device=device, dtype=dtype)
    adam = Adam(params, lr=0.05, num_steps=10)
    tokens, lengths = encode_docs(TOKENIZER, DOCS, CONFIG.block_size)
    tok, lens = to_batch(tokens, lengths, name, device=device)
    for _ in range(steps):
        loss, grads = loss_and_grads(params, tok, lens)
        params = adam.step(params, grads)
        # as train() does: evaluate each step (a no-op on eager backends)
        _, params, adam.m, adam.v = materialize(loss, params, adam.m, adam.v)
    return params, adam


@pytest.fixture
def saved(tmp_path: Path) -> tuple[Path, Params, Adam]:
    """A float64 NumPy checkpoint on disk, with what was saved."""
    params, adam = _trained()
    path = save(tmp_path / "model.ckpt", params, adam=adam, step=2, tokenizer=TOKENIZER)
    return path, params, adam


# -- round trips ---------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_round_trip(backend: Any, tmp_path: Path, dtype: str) -> None:
    params, adam = _trained(backend.name, backend.device, dtype)
    meta = {"note": "hi", "losses": [3.25, 3.0], "nested": {"a": 1}}
    path = save(
        tmp_path / "sub" / "run.ckpt", params, adam=adam, step=7, tokenizer=TOKENIZER, meta=meta
    )
    assert path == tmp_path / "sub" / "run.ckpt" and path.is_file()
    got = load(path, backend=backend.name, device=backend.device)
    assert got.step == 7
    assert got.config == CONFIG
    assert got.tokenizer == TOKENIZER
    assert got.meta == meta
    assert got.params.backend == backend.name
    assert str(got.params.device) == str(params.device)
    assert str(got.params.dtype) == str(params.dtype)
    assert_params_equal(got.params, params)
    assert got.adam is not None
    assert got.adam.state_dict() == adam.state_dict()
    assert got.adam.t == 2
    assert_params_equal(got.adam.m, adam.m)
    assert_params_equal(got.adam.v, adam.v)
    assert got.adam.m.backend == backend.name
    # the moments are non-trivial, so the round trip above tested something
    assert np.any(_host(adam.m)["wte"] != 0) and np.any(_host(adam.v)["mlp_fc2"] != 0)


def test_round_trip_continues_identically(backend: Any, tmp_path: Path) -> None:
    """A loaded Adam takes the same next step as the one that was saved."""
    params, adam = _trained(backend.name, backend.device)
    path = save(tmp_path / "c.ckpt", params, adam=adam, step=2)
    got = load(path, backend=backend.name, device=backend.device)
    assert got.adam is not None
    tokens, lengths = encode_docs(TOKENIZER, DOCS[:2], CONFIG.block_size)
    tok, lens = backend.asarray(tokens), backend.asarray(lengths)
    _, g1 = loss_and_grads(params, tok, lens)
    _, g2 = loss_and_grads(got.params, tok, lens)
    want, got_next = materialize(adam.step(params, g1), got.adam.step(got.params, g2))
    assert_params_equal(got_next, want)


def test_load_on_numpy_and_other_dtype(saved: tuple[Path, Params, Adam]) -> None:
    path, params, _ = saved
    got = load(path, dtype="float32")
    assert str(got.params.dtype) == "float32"
    float32_on_numpy = np.zeros((), dtype=np.float32)
    for k, a in _host(params).items():
        want = a.astype(np.float32)
        xp_assert_close(getattr(got.params, k), want, rtol=0, like=float32_on_numpy, what=k)
    with pytest.raises(ValueError, match="dtype"):
        load(path, dtype="float16")


def test_round_trip_without_adam_and_tokenizer(tmp_path: Path) -> None:
    params = init_params(CONFIG, seed=1)
    path = save(tmp_path / "bare.ckpt", params)
    got = load(path)
    assert got.adam is None and got.tokenizer is None
    assert got.step == 0 and got.meta == {}
    assert_params_equal(got.params, params)


def test_save_overwrites(saved: tuple[Path, Params, Adam]) -> None:
    path, params, adam = saved
    save(path, params, adam=adam, step=5, meta={"second": True})
    got = load(path)
    assert got.step == 5 and got.meta == {"second": True}


# -- atomic saves ---------------------------------------------------------------------------
def _leftovers(folder: Path, keep: Path) -> list[Path]:
    return [p for p in folder.iterdir() if p != keep]


def test_crash_in_rename_keeps_previous(
    saved: tuple[Path, Params, Adam], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, params, adam = saved
    before = path.read_bytes()

    def crash(*args: Any, **kwargs: Any) -> None:
        raise OSError("simulated crash in rename")

    monkeypatch.setattr(os, "replace", crash)
    new = init_params(CONFIG, seed=99, dtype="float64")
    with pytest.raises(OSError, match="simulated"):
        save(path, new, adam=adam, step=3)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert _leftovers(path.parent, path) == []
    got = load(path)
    assert got.step == 2
    assert_params_equal(got.params, params)


@pytest.mark.parametrize("exc", [OSError("disk full"), KeyboardInterrupt()])
def test_crash_mid_write_keeps_previous(
    saved: tuple[Path, Params, Adam], monkeypatch: pytest.MonkeyPatch, exc: BaseException
) -> None:
    path, params, adam = saved
    before = path.read_bytes()
    real_fdopen = os.fdopen

    class HalfWriter:
        """Writes half of what it is given, then fails like a full disk or a Ctrl-C."""

        def __init__(self, f: Any) -> None:
            self.f = f

        def __enter__(self) -> HalfWriter:
            return self

        def __exit__(self, *args: Any) -> None:
            self.f.close()

        def write(self, b: bytes) -> int:
            self.f.write(b[: len(b) // 2])
            self.f.flush()
            raise exc

        def __getattr__(self, name: str) -> Any:
            return getattr(self.f, name)

    monkeypatch.setattr(os, "fdopen", lambda *a, **k: HalfWriter(real_fdopen(*a, **k)))
    with pytest.raises(type(exc)):
        save(path, init_params(CONFIG, seed=5, dtype="float64"), adam=adam, step=9)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert _leftovers(path.parent, path) == []
    assert_params_equal(load(path).params, params)


def test_first_save_crash_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def crash(*args: Any, **kwargs: Any) -> None:
        raise OSError("simulated crash in fsync")

    monkeypatch.setattr(os, "fsync", crash)
    with pytest.raises(OSError, match="simulated"):
        save(tmp_path / "new.ckpt", init_params(CONFIG))
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []


# -- refusals ----------------------------------------------------------------------------
def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist") as info:
        load(tmp_path / "absent.ckpt")
    assert "absent.ckpt" in str(info.value)


@pytest.mark.parametrize("keep", [0.01, 0.1, 0.5, 0.9, 0.999])
def test_truncated_file(saved: tuple[Path, Params, Adam], keep: float) -> None:
    path, _, _ = saved
    raw = path.read_bytes()
    path.write_bytes(raw[: int(len(raw) * keep)])
    with pytest.raises(CheckpointError, match="corrupt or truncated") as info:
        load(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("content", [b"", b"just some text\n"], ids=["empty", "text"])
def test_non_archive_file_is_refused(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "notes.ckpt"
    path.write_bytes(content)
    with pytest.raises(CheckpointError, match="not a microgpt-xp checkpoint") as info:
        load(path)
    assert str(path) in str(info.value)


def test_flipped_bytes_in_an_array(saved: tuple[Path, Params, Adam]) -> None:
    path, params, _ = saved
    raw = bytearray(path.read_bytes())
    data = _host(params)["mlp_fc1"].tobytes()
    at = raw.find(data)
    assert at > 0  # .npz members are stored uncompressed
    raw[at + len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))
    # the zip's own CRC catches a raw flip
    with pytest.raises(CheckpointError, match="corrupt"):
        load(path)


def _rewrite(path: Path, edit: Any) -> None:
    """Rewrite an .npz as a valid archive, passing each member's array through ``edit``
    (``edit(name, array) -> array | None``; ``None`` drops the member). An edited header
    gets its checksum recomputed, as a file written that way (by another version, say)
    would have it."""
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    out = {}
    for k, a in arrays.items():
        b = edit(k, a.copy())
        if b is not None:
            out[k] = b
    if "__header__" in out and "__header_sha256__" in out:
        digest = hashlib.sha256(out["__header__"].tobytes()).hexdigest().encode()
        out["__header_sha256__"] = np.frombuffer(digest, dtype=np.uint8)
    buf = io.BytesIO()
    np.savez(buf, **out)
    path.write_bytes(buf.getvalue())


def test_corrupt_array_fails_its_checksum(saved: tuple[Path, Params, Adam]) -> None:
    path, _, _ = saved

    def flip(name: str, a: np.ndarray) -> np.ndarray:
        if name == "adam_v/attn_wk":
            raw = bytearray(a.tobytes())
            raw[len(raw) // 2] ^= 0x01
            a = np.frombuffer(bytes(raw), dtype=a.dtype).reshape(a.shape)
        return a

    _rewrite(path, flip)
    with pytest.raises(CheckpointError, match="checksum") as info:
        load(path)
    assert "adam_v/attn_wk" in str(info.value)


def test_missing_array_is_refused(saved: tuple[Path, Params, Adam]) -> None:
    path, _, _ = saved
    _rewrite(path, lambda name, a: None if name == "params/wpe" else a)
    with pytest.raises(CheckpointError, match="incomplete"):
        load(path)


def test_non_checkpoint_npz(tmp_path: Path) -> None:
    path = tmp_path / "other.npz"
    np.savez(path, x=np.arange(3), y=np.ones((2, 2)))
    with pytest.raises(CheckpointError, match="not a microgpt-xp checkpoint"):
        load(path)


def test_foreign_header_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.npz"
    header = json.dumps({"format": "something-else", "version": 1}).encode()
    np.savez(path, __header__=np.frombuffer(header, dtype=np.uint8), x=np.arange(3))
    with pytest.raises(CheckpointError, match="not a microgpt-xp checkpoint"):
        load(path)


def test_newer_version_is_refused(saved: tuple[Path, Params, Adam]) -> None:
    path, _, _ = saved

    def bump(name: str, a: np.ndarray) -> np.ndarray:
        if name == "__header__":
            header = json.loads(a.tobytes().decode())
            header["version"] = 3
            a = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
        return a

    _rewrite(path, bump)
    with pytest.raises(CheckpointError, match="format version 3; this microgpt-xp reads"):
        load(path)


def test_garbled_header_is_refused(saved: tuple[Path, Params, Adam]) -> None:
    path, _, _ = saved
    _rewrite(
        path,
        lambda name, a: (
            np.frombuffer(b"\xff{not json", dtype=np.uint8) if name == "__header__" else a
        ),
    )
    with pytest.raises(CheckpointError, match="not a microgpt-xp checkpoint"):
        load(path)


def test_config_mismatch(saved: tuple[Path, Params, Adam]) -> None:
    path, _, _ = saved
    other = GPTConfig(vocab_size=CONFIG.vocab_size, n_layer=1, n_embd=8, n_head=2, block_size=6)
    with pytest.raises(CheckpointError, match="not the requested") as info:
        load(path, config=other)
    assert "n_layer=2" in str(info.value) and "n_layer=1" in str(info.value)
    assert load(path, config=CONFIG).config == CONFIG


def test_checkpoint_error_is_a_value_error() -> None:
    assert issubclass(CheckpointError, ValueError)


@pytest.mark.parametrize(
    "header",
    [{"format": "microgpt-xp-checkpoint", "version": 1}, [1, 2]],
    ids=["no-checksums", "not-an-object"],
)
def test_malformed_header_is_refused(tmp_path: Path, header: Any) -> None:
    path = tmp_path / "odd.npz"
    raw = json.dumps(header).encode()
    np.savez(path, __header__=np.frombuffer(raw, dtype=np.uint8))
    with pytest.raises(CheckpointError):
        load(path)


# -- what the checksums cover ----------------------------------------------------------------
def _edit_member(name: str, edit: Any) -> Any:
    """An edit for :func:`_rewrite` that passes the member ``name`` through ``edit``."""
    return lambda k, a: edit(a) if k == name else a


@pytest.mark.parametrize(
    "view",
    [
        lambda a: a.view(a.dtype.newbyteorder()),  # the other byte order
        lambda a: a.view(np.float32),  # float32 over the same bytes (twice the columns)
        lambda a: a.view(np.int64),
        lambda a: a.reshape(a.shape[::-1]),  # another shape
    ],
    ids=["byte-order", "float32", "int64", "shape"],
)
def test_a_weight_rewritten_over_the_same_bytes_is_refused(
    saved: tuple[Path, Params, Adam], view: Any
) -> None:
    """The SHA-256 of the bytes is unchanged: the header's record of the dtype, byte order
    and shape is what refuses it."""
    path, _, _ = saved
    _rewrite(path, _edit_member("params/wte", view))
    with pytest.raises(CheckpointError, match="params/wte") as info:
        load(path)
    assert "\n" not in str(info.value)


def test_a_missing_header_checksum_is_refused(saved: tuple[Path, Params, Adam]) -> None:
    path, _, _ = saved
    _rewrite(path, lambda k, a: None if k == "__header_sha256__" else a)
    with pytest.raises(CheckpointError, match="no header checksum"):
        load(path)


def _bloat(path: Path, member: str, nbytes: int) -> None:
    """Replace ``member`` of the archive by ``nbytes`` zeros, deflated (a few KiB on disk)."""
    import zipfile

    with zipfile.ZipFile(path) as z:
        members = {i.filename: z.read(i) for i in z.infolist()}
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for k, raw in members.items():
            if k == member:
                info = zipfile.ZipInfo(k)
                info.compress_type = zipfile.ZIP_DEFLATED
                with z.open(info, "w", force_zip64=True) as f:
                    chunk = bytes(1 << 20)
                    for _ in range(nbytes >> 20):
                        f.write(chunk)
            else:
                z.writestr(k, raw)


@pytest.mark.parametrize("member", ["params/wte.npy", "__header__.npy", "adam_v/mlp_fc2.npy"])
def test_declared_sizes_are_checked_before_anything_is_inflated(
    saved: tuple[Path, Params, Adam], member: str
) -> None:
    import tracemalloc

    path, _, _ = saved
    _bloat(path, member, 256 << 20)  # 256 MiB of zeros, under 1 MiB on disk
    assert path.stat().st_size < 2 << 20
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointError, match="size"):
            load(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"{peak / 2**20:.0f} MiB traced"


def test_a_deflated_checkpoint_loads_as_saved(saved: tuple[Path, Params, Adam]) -> None:
    import zipfile

    path, params, _ = saved
    raw = {}
    with zipfile.ZipFile(path) as z:
        raw = {i.filename: z.read(i) for i in z.infolist()}
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for k, b in raw.items():
            z.writestr(k, b)
    assert_params_equal(load(path).params, params)


def _as_version_1(path: Path) -> None:
    """Rewrite a checkpoint as version 1 wrote it: a SHA-256 per array of its bytes, one
    dtype name for every array, no record of each array's dtype and shape."""

    def edit(k: str, a: np.ndarray) -> np.ndarray:
        if k != "__header__":
            return a
        header = json.loads(a.tobytes().decode())
        arrays = header.pop("arrays")
        header["version"] = 1
        header["sha256"] = {name: rec["sha256"] for name, rec in arrays.items()}
        return np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)

    _rewrite(path, edit)


def test_a_version_1_checkpoint_loads_with_the_same_checks(
    saved: tuple[Path, Params, Adam],
) -> None:
    path, params, adam = saved
    _as_version_1(path)
    got = load(path)
    assert got.step == 2 and got.tokenizer == TOKENIZER
    assert_params_equal(got.params, params)
    assert got.adam is not None
    assert_params_equal(got.adam.m, adam.m)
    _rewrite(path, _edit_member("adam_m/wpe", lambda a: a.view(a.dtype.newbyteorder())))
    with pytest.raises(CheckpointError, match="adam_m/wpe"):
        load(path)


def test_save_refuses_weights_load_would_refuse(tmp_path: Path) -> None:
    params = init_params(CONFIG, dtype="float32")
    half = Params.trusted(CONFIG, {k: v.astype(np.float16) for k, v in params.arrays().items()})
    with pytest.raises(TypeError, match="float16"):
        save(tmp_path / "half.ckpt", half)
    assert list(tmp_path.iterdir()) == []
