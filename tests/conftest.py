"""Shared fixtures: ``backend`` runs a test once per array namespace (``MICROGPT_XP_BACKENDS``,
comma-separated, narrows them; default: every importable one)."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import reference

from microgpt_xp import GPTConfig, _xp
from microgpt_xp._backends import BACKENDS

#: Backends' test devices where not the default: a forgotten ``device=`` fails loudly.
TEST_DEVICE = {"array_api_strict": "device1"}

ROOT = Path(__file__).resolve().parent.parent
NAMES_TXT = ROOT.parent / "shared" / "data" / "names.txt"

#: The original's state-dict keys and shapes (spec §4) for V = 27, C = 16, T = 16, one layer.
SPEC_SHAPES = (
    {"wte": (27, 16), "wpe": (16, 16), "lm_head": (27, 16)}
    | {f"layer0.{k}": (16, 16) for k in ("attn_wq", "attn_wk", "attn_wv", "attn_wo")}
    | {"layer0.mlp_fc1": (64, 16), "layer0.mlp_fc2": (16, 64)}
)


@functools.cache
def ref_state(config: GPTConfig, seed: int) -> dict[str, list[list[float]]]:
    """A reference state dict (Gaussian, std 0.08, Python ``random``) for ``config``."""
    c, rng = config, random.Random(seed)
    return reference.init_state_dict(c.vocab_size, c.n_layer, c.n_embd, c.block_size, rng=rng)


def gpu_usable(name: str) -> bool:
    """Whether the GPU backend ``name`` can create an array on its default device."""
    try:
        _xp.asarray([0.0], name)
        return True
    except Exception:
        return False


def selected_backends() -> list[str]:
    """Backends chosen by MICROGPT_XP_BACKENDS, or all installed ones."""
    names = [n.strip() for n in os.environ.get("MICROGPT_XP_BACKENDS", "").split(",") if n.strip()]
    if names:
        for n in names:
            _xp.check_backend(n)
        return names
    return [n for n, b in BACKENDS.items() if importlib.util.find_spec(b.package)]


@dataclass
class Backend:
    """One array namespace under test, with helpers to move host data there and back."""

    name: str
    device: Any

    @property
    def xp(self) -> Any:
        return _xp.namespace(self.name)

    def asarray(self, host: Any, dtype: str | None = None, chunks: Any = None) -> Any:
        if self.name == "dask" and chunks is None:
            host = np.asarray(host)
            # chunk along the batch axis so that tests exercise multi-chunk graphs
            chunks = (max(1, host.shape[0] // 2),) + (-1,) * (host.ndim - 1) if host.ndim else -1
        return _xp.asarray(host, self.name, device=self.device, dtype=dtype, chunks=chunks)

    def to_numpy(self, x: Any) -> np.ndarray:
        return _xp.to_numpy(x)


@pytest.fixture(params=selected_backends())
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    """One array namespace; on JAX and Dask, a module's ``lazy_xp_function`` tags run lazily."""
    name = request.param
    spec = BACKENDS[name]
    if importlib.util.find_spec(spec.package) is None:
        pytest.skip(f"{name} is not installed")
    if spec.needs_gpu and not gpu_usable(name):
        pytest.skip(f"{name} needs a GPU, and none is usable here")
    lazy = contextlib.nullcontext()
    if name in ("jax", "dask") and hasattr(request.module, "lazy_xp_function"):
        from array_api_extra.testing import patch_lazy_xp_functions

        lazy = patch_lazy_xp_functions(request, xp=_xp.namespace(name))
    if name == "dask":
        import dask

        # the synchronous scheduler keeps tests deterministic and light on 2 cores
        with dask.config.set(scheduler="synchronous"), lazy:
            yield Backend(name, None)
        return
    with lazy:
        yield Backend(name, TEST_DEVICE.get(name))


@pytest.fixture
def names_txt() -> Path:
    """makemore's names.txt from ../shared, or skip."""
    if not NAMES_TXT.is_file():
        pytest.skip(f"{NAMES_TXT} is absent")
    return NAMES_TXT


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With ``MICROGPT_XP_BACKEND_ONLY=1``, only tests of ``backend`` or ``needs_<backend>``."""
    if os.environ.get("MICROGPT_XP_BACKEND_ONLY") != "1":
        return
    markers = {f"needs_{name}" for name in selected_backends()}

    def wanted(item: pytest.Item) -> bool:
        if "backend" in getattr(item, "fixturenames", ()):
            return True
        return any(item.get_closest_marker(m) is not None for m in markers)

    drop = [i for i in items if not wanted(i)]
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = [i for i in items if wanted(i)]
