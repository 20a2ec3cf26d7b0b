"""microgpt_xp.checkpoint: lossless round trips, atomic saves and clear refusals of files that
are missing, truncated, corrupt, foreign or of another model."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import subprocess
import sys
import tracemalloc
import zipfile
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pytest
from xp_testing import assert_params_equal, host_arrays, xp_assert_close

from microgpt_xp import GPTConfig, Params, init_params, loss_and_grads
from microgpt_xp._errors import ArgumentValueError
from microgpt_xp.checkpoint import CheckpointError, load, peek, save
from microgpt_xp.data import Tokenizer, encode_docs
from microgpt_xp.optim import Adam, AdamConfig
from microgpt_xp.params import materialize
from microgpt_xp.train import to_batch

DOCS = ["abca", "bc", "cabbac", "a"]
TOKENIZER = Tokenizer.from_docs(DOCS)
CONFIG = GPTConfig(vocab_size=TOKENIZER.vocab_size, n_layer=2, n_embd=8, n_head=2, block_size=6)


def _trained(
    name: str = "numpy", device: Any = None, dtype: str = "float64"
) -> tuple[Params, Adam]:
    """Params and an Adam with non-zero moments (a couple of real updates)."""
    params = init_params(CONFIG, seed=3, backend=name, device=device, dtype=dtype)
    adam = Adam(params, lr=0.05, num_steps=10)
    tokens, lengths = encode_docs(TOKENIZER, DOCS, CONFIG.block_size)
    tok, lens = to_batch(tokens, lengths, name, device=device)
    for _ in range(2):
        loss, grads = loss_and_grads(params, tok, lens)
        params = adam.step(params, grads)
        # as train() does: evaluate each step (a no-op on eager backends)
        _, params, adam.state = materialize(loss, params, adam.state)
    return params, adam


Saved = tuple[Path, Params, Adam]


@pytest.fixture
def saved(tmp_path: Path) -> Saved:
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
    assert (got.step, got.config, got.tokenizer, got.meta) == (7, CONFIG, TOKENIZER, meta)
    assert str(got.params.device) == str(params.device) and got.params.backend == backend.name
    assert str(got.params.dtype) == str(params.dtype)
    assert_params_equal(got.params, params)
    assert got.adam is not None and got.adam.state_dict() == adam.state_dict()
    assert got.adam.t == 2 and got.adam.m.backend == backend.name
    assert_params_equal(got.adam.m, adam.m)
    assert_params_equal(got.adam.v, adam.v)
    assert np.any(host_arrays(adam.m)["wte"] != 0) and np.any(host_arrays(adam.v)["mlp_fc2"] != 0)
    # the loaded Adam takes the same next step as the one that was saved
    tokens, lengths = encode_docs(TOKENIZER, DOCS[:2], CONFIG.block_size)
    tok, lens = backend.asarray(tokens), backend.asarray(lengths)
    _, g1 = loss_and_grads(params, tok, lens)
    _, g2 = loss_and_grads(got.params, tok, lens)
    want, got_next = materialize(adam.step(params, g1), got.adam.step(got.params, g2))
    assert_params_equal(got_next, want)


def test_load_as_float32_save_over_and_config_mismatch(saved: Saved) -> None:
    path, params, adam = saved
    got = load(path, dtype="float32")
    assert str(got.params.dtype) == "float32"
    float32_on_numpy = np.zeros((), dtype=np.float32)
    for k, a in host_arrays(params).items():
        want = a.astype(np.float32)
        xp_assert_close(getattr(got.params, k), want, rtol=0, like=float32_on_numpy, what=k)
    # save over it, a bare checkpoint
    save(path, params, adam=adam, step=5, meta={"second": True})
    assert (load(path).step, load(path).meta) == (5, {"second": True})
    bare = init_params(CONFIG, seed=1)
    got = load(save(path, bare))
    assert (got.adam, got.tokenizer, got.step, got.meta) == (None, None, 0, {})
    assert_params_equal(got.params, bare)
    # another config
    other = GPTConfig(vocab_size=CONFIG.vocab_size, n_layer=1, n_embd=8, n_head=2, block_size=6)
    with pytest.raises(CheckpointError, match="not the requested") as info:
        load(path, config=other)
    assert "n_layer=2" in str(info.value) and "n_layer=1" in str(info.value)
    assert load(path, config=CONFIG).config == CONFIG and issubclass(CheckpointError, ValueError)


def test_peek_reads_the_header_only(saved: Saved) -> None:
    """The header alone (for ``train --resume``): a damaged array does not show, a header does."""
    path, params, adam = saved
    save(path, params, adam=adam, step=4, tokenizer=TOKENIZER, meta={"run": {"mode": "text"}})
    _rewrite(path, "adam_v/attn_wk", _flip_bit)
    assert tuple(peek(path)) == (CONFIG, TOKENIZER, 4, {"run": {"mode": "text"}})
    _rewrite(path, "__header__", {"step": -1})
    with pytest.raises(CheckpointError, match="invalid step -1"):
        peek(path)


# -- atomic saves (a crash mid-write: test_files.py's test_a_failed_block_leaves_the_old_file) ---
@pytest.mark.parametrize("crash", ["replace", "fsync", "ctrl-c"])
def test_a_crashed_save_keeps_the_previous_file_or_leaves_nothing(
    saved: Saved, monkeypatch: pytest.MonkeyPatch, crash: str
) -> None:
    """A save that fails (``os.replace`` or ``fsync``, or a Ctrl-C while zipfile opens an
    entry: it reaches the caller as the interrupt, not as the ``ValueError`` of the archive's
    close that it triggers) leaves the previous file as it was, and no new one."""
    path, params, adam = saved
    before, new = path.read_bytes(), path.parent / "new.ckpt"

    def interrupted(archive: zipfile.ZipFile, *args: Any, **kwargs: Any) -> Any:
        archive._writing = True  # the handle is open when the signal lands
        raise KeyboardInterrupt

    if crash == "ctrl-c":
        monkeypatch.setattr(zipfile.ZipFile, "_open_to_write", interrupted)
        error, match = KeyboardInterrupt, None
    else:
        error, match = OSError, f"simulated crash in {crash}"
        monkeypatch.setattr(os, crash, mock.Mock(side_effect=OSError(match)))
    for target in (path, new):
        with pytest.raises(error, match=match):
            save(target, init_params(CONFIG, seed=99, dtype="float64"), adam=adam, step=3)
    monkeypatch.undo()
    assert path.read_bytes() == before and list(path.parent.iterdir()) == [path]
    assert load(path).step == 2
    assert_params_equal(load(path).params, params)


def test_weights_that_load_would_refuse_are_not_saved(tmp_path: Path) -> None:
    params = init_params(CONFIG, dtype="float32")
    half = Params.trusted(CONFIG, {k: v.astype(np.float16) for k, v in params.arrays().items()})
    with pytest.raises(TypeError, match="float16"):
        save(tmp_path / "half.ckpt", half)
    assert list(tmp_path.iterdir()) == []


# -- refusals ----------------------------------------------------------------------------
def _npz(path: Path, header: Any = None, **arrays: Any) -> None:
    """Write an .npz archive of ``arrays`` and, if given, a JSON ``header`` (no checksum)."""
    if header is not None:
        arrays["__header__"] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    path.write_bytes(buf.getvalue())


def _rewrite(path: Path, member: str, edit: Any) -> None:
    """Rewrite ``member`` of an .npz by ``edit`` (``None`` drops it; a dict updates the header,
    ``{"arrays": "version 1"}`` makes it version 1's), the header's checksum recomputed."""
    with np.load(path) as z:
        out = {k: z[k] for k in z.files}
    if isinstance(edit, dict):
        header = json.loads(out[member].tobytes().decode())
        if "arrays" in edit:
            arrays = header.pop("arrays")
            edit = {"version": 1, "sha256": {k: rec["sha256"] for k, rec in arrays.items()}}
        header = {**header, **edit}
        out[member] = np.frombuffer(json.dumps(header).encode(), dtype=np.uint8)
    elif edit is None:
        del out[member]
    else:
        out[member] = edit(out[member].copy())
    if "__header__" in out and "__header_sha256__" in out:
        digest = hashlib.sha256(out["__header__"].tobytes()).hexdigest().encode()
        out["__header_sha256__"] = np.frombuffer(digest, dtype=np.uint8)
    _npz(path, **out)


def _flip_bit(a: np.ndarray) -> np.ndarray:
    raw = bytearray(a.tobytes())
    raw[len(raw) // 2] ^= 0x01
    return np.frombuffer(bytes(raw), dtype=a.dtype).reshape(a.shape)


def _flip_raw_bytes(path: Path) -> None:
    raw = bytearray(path.read_bytes())
    with np.load(path) as z:
        data = z["params/mlp_fc1"].tobytes()
    at = raw.find(data)
    assert at > 0  # .npz members are stored uncompressed
    raw[at + len(data) // 2] ^= 0xFF  # the zip's own CRC catches a raw flip
    path.write_bytes(bytes(raw))


#: ``damage: (edit, match)``: a fraction to keep, bytes, ``(member, edit)``, or a function.
REFUSALS: dict[str, tuple[Any, str]] = {
    "missing": (Path.unlink, "does not exist"),
    **{f"truncated-{k}": (k, "corrupt or truncated") for k in (0.01, 0.1, 0.5, 0.9, 0.999)},
    "empty": (b"", "not a microgpt-xp checkpoint"),
    "text": (b"just some text\n", "not a microgpt-xp checkpoint"),
    "flipped-bytes": (_flip_raw_bytes, "corrupt"),
    "corrupt-array": (("adam_v/attn_wk", _flip_bit), "'adam_v/attn_wk' fails its checksum"),
    "missing-array": (("params/wpe", None), "incomplete"),
    "other-npz": (lambda p: _npz(p, x=np.arange(3), y=np.ones((2, 2))), "not a microgpt-xp"),
    "foreign-header": (lambda p: _npz(p, {"format": "something-else", "version": 1},
                                      x=np.arange(3)), "not a microgpt-xp checkpoint"),
    "newer-version": (("__header__", {"version": 3}), "format version 3; this microgpt-xp reads"),
    "garbled-header": (("__header__", lambda a: np.frombuffer(b"\xff{not json", np.uint8)),
                       "not a microgpt-xp checkpoint"),
    "no-checksums": (lambda p: _npz(p, {"format": "microgpt-xp-checkpoint", "version": 1}),
                     "no header checksum"),
    "not-an-object": (lambda p: _npz(p, [1, 2]), "not a microgpt-xp checkpoint"),
    "no-header-checksum": (("__header_sha256__", None), "no header checksum"),
    # the bytes' SHA-256 is unchanged: the header's dtype, byte order and shape refuse these
    "byte-order": (("params/wte", lambda a: a.view(a.dtype.newbyteorder())), "params/wte"),
    "float32-view": (("params/wte", lambda a: a.view(np.float32)), "params/wte"),
    "int64-view": (("params/wte", lambda a: a.view(np.int64)), "params/wte"),
    "shape": (("params/wte", lambda a: a.reshape(a.shape[::-1])), "params/wte"),
    "invalid-step": (("__header__", {"step": -1}), "invalid header: invalid step -1"),
}  # fmt: skip


@pytest.mark.parametrize("damage", list(REFUSALS))
def test_damaged_or_foreign_files_are_refused(saved: Saved, damage: str) -> None:
    path, _, _ = saved
    edit, match = REFUSALS[damage]
    if isinstance(edit, float):
        path.write_bytes(path.read_bytes()[: int(path.stat().st_size * edit)])
    elif isinstance(edit, bytes):
        path.write_bytes(edit)
    elif isinstance(edit, tuple):
        _rewrite(path, *edit)
    else:
        edit(path)
    with pytest.raises(CheckpointError, match=match) as info:
        load(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


#: The Adam record of a checkpoint written before the schedule options (issue 33).
_OLD_ADAM = {"lr": 0.05, "beta1": 0.85, "beta2": 0.99, "eps": 1e-8, "num_steps": 10, "t": 2}
_OPTIONS = {"warmup": 2, "decay": "cosine", "min_lr": 0.001, "weight_decay": 0.1,
            "grad_clip": 1.0, "init_std": 0.02}  # fmt: skip


@pytest.mark.parametrize(
    ("adam", "match"),
    [(_OLD_ADAM, None), ({**_OLD_ADAM, **_OPTIONS}, None),
     ({**_OLD_ADAM, "decay": "step"}, "decay must be one of"),
     ({**_OLD_ADAM, "warmup": 10}, "warmup must be less than num_steps=10")],
)  # fmt: skip
def test_adam_options_in_the_header(saved: Saved, adam: dict[str, Any], match: str | None) -> None:
    """An old file (no options recorded) loads with the spec's; the options round-trip."""
    path, _, _ = saved
    _rewrite(path, "__header__", {"adam": adam})
    if match is not None:
        with pytest.raises(CheckpointError, match=match):
            load(path)
        return
    got = load(path).adam
    assert got is not None and got.state_dict() == {**dataclasses.asdict(AdamConfig()), **adam}
    save(path, load(path).params, adam=got)
    with np.load(path) as z:
        assert json.loads(z["__header__"].tobytes())["adam"] == got.state_dict()


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [({"backend": "bogus"}, "backend"), ({"dtype": "float16"}, "dtype"),
     ({"device": "gpu7"}, "device")],
)  # fmt: skip
def test_bad_arguments_are_argument_errors_not_the_files(
    saved: Saved, kwargs: dict[str, str], param: str
) -> None:
    path, _, _ = saved
    with pytest.raises(ArgumentValueError, match=param) as info:
        load(path, **kwargs)
    assert info.value.param == param and not isinstance(info.value, CheckpointError)
    with pytest.raises(ArgumentValueError, match=param):
        load(path.parent / "absent.ckpt", **kwargs)  # checked before the file


_LOW_MEMORY = """
import resource, sys
from microgpt_xp import load  # imports the checkpoint module (and NumPy) before the limit
vm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmSize"))
resource.setrlimit(resource.RLIMIT_AS, (vm * 1024 + (16 << 20),) * 2)
try:
    load(sys.argv[1])
except MemoryError as exc:
    print(exc)
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux's /proc")
def test_a_checkpoint_too_large_for_memory_is_not_called_corrupt(tmp_path: Path) -> None:
    """A valid 64 MB checkpoint under a tight memory limit: a ``MemoryError``, never "corrupt"."""
    params = init_params(GPTConfig(vocab_size=3, n_layer=2, n_embd=256), dtype="float64")
    path = save(tmp_path / "big.ckpt", params, adam=Adam(params))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1]), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-c", _LOW_MEMORY, str(path)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert "does not fit in this machine's memory" in out.stdout, out.stdout + out.stderr
    assert "free memory" in out.stdout and "corrupt" not in out.stdout.replace("not corrupt", "")


# -- sizes, compression and version 1 -----------------------------------------------------------
def _deflate(path: Path, bloat: str = "", nbytes: int = 0) -> None:
    """Rewrite the archive deflated, member ``bloat`` replaced by ``nbytes`` zeros."""
    with zipfile.ZipFile(path) as z:
        members = {i.filename: z.read(i) for i in z.infolist()}
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for k, raw in members.items():
            if k != bloat:
                z.writestr(k, raw)
                continue
            info = zipfile.ZipInfo(k)
            info.compress_type = zipfile.ZIP_DEFLATED
            with z.open(info, "w", force_zip64=True) as f:
                for _ in range(nbytes >> 20):
                    f.write(bytes(1 << 20))


@pytest.mark.parametrize("member", ["params/wte.npy", "__header__.npy", "adam_v/mlp_fc2.npy"])
def test_declared_sizes_are_checked_before_anything_is_inflated(saved: Saved, member: str) -> None:
    path, _, _ = saved
    _deflate(path, member, 256 << 20)  # 256 MiB of zeros, under 1 MiB on disk
    assert path.stat().st_size < 2 << 20
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointError, match="size"):
            load(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"{peak / 2**20:.0f} MiB traced"


def test_a_deflated_or_version_1_checkpoint_loads_with_the_same_checks(saved: Saved) -> None:
    path, params, adam = saved
    _deflate(path)
    assert_params_equal(load(path).params, params)
    _rewrite(path, "__header__", {"arrays": "version 1"})
    got = load(path)
    assert got.step == 2 and got.tokenizer == TOKENIZER
    assert_params_equal(got.params, params)
    assert got.adam is not None
    assert_params_equal(got.adam.m, adam.m)
    _rewrite(path, "adam_m/wpe", lambda a: a.view(a.dtype.newbyteorder()))
    with pytest.raises(CheckpointError, match="adam_m/wpe"):
        load(path)
