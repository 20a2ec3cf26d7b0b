"""The record of weights: ``Params``, its initialisation and its moves between namespaces."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import array_api_compat
import numpy as np

from . import _pytree, _xp
from .config import GPTConfig

#: Global weights, in the spec's state-dict order.
GLOBAL_FIELDS: tuple[str, ...] = ("wte", "wpe", "lm_head")
#: Per-layer weights (stacked along a leading ``n_layer`` axis), in the spec's order.
LAYER_FIELDS: tuple[str, ...] = (
    "attn_wq",
    "attn_wk",
    "attn_wv",
    "attn_wo",
    "mlp_fc1",
    "mlp_fc2",
)
FIELDS: tuple[str, ...] = GLOBAL_FIELDS + LAYER_FIELDS

#: The entry beside the weights in which an exported state dict carries its tokenizer
#: (``{"chars": ...}``); :meth:`Params.from_state_dict` passes over it.
TOKENIZER_KEY = "tokenizer"

#: Standard deviation of the initial Gaussian weights (the spec's 0.08).
INIT_STD = 0.08


def field_shapes(config: GPTConfig) -> dict[str, tuple[int, ...]]:
    """Shape of every ``Params`` field for ``config`` (matrices are ``[n_out, n_in]``)."""
    v, c, t, n = config.vocab_size, config.n_embd, config.block_size, config.n_layer
    return {
        "wte": (v, c),
        "wpe": (t, c),
        "lm_head": (v, c),
        "attn_wq": (n, c, c),
        "attn_wk": (n, c, c),
        "attn_wv": (n, c, c),
        "attn_wo": (n, c, c),
        "mlp_fc1": (n, 4 * c, c),
        "mlp_fc2": (n, c, 4 * c),
    }


def state_dict_keys(config: GPTConfig) -> list[str]:
    """The original's state-dict keys in its order: ``wte, wpe, lm_head, layer0.attn_wq, …``."""
    keys = list(GLOBAL_FIELDS)
    for i in range(config.n_layer):
        keys += [f"layer{i}.{name}" for name in LAYER_FIELDS]
    return keys


@dataclass(frozen=True)
class Params:
    """microgpt's weights, every field an array of one namespace, device and dtype.

    Fields (``V`` vocab, ``T`` block_size, ``C`` n_embd, ``L`` n_layer):
    ``wte [V, C]``, ``wpe [T, C]``, ``lm_head [V, C]``, ``attn_wq/attn_wk/attn_wv/attn_wo
    [L, C, C]``, ``mlp_fc1 [L, 4C, C]``, ``mlp_fc2 [L, C, 4C]``. Matrices are stored
    ``[n_out, n_in]`` as in the original, so a linear layer is ``y = x @ W.T``.

    The same record type holds gradients and Adam moments. It is immutable: updates
    build a new ``Params`` (see :meth:`map`).
    """

    config: GPTConfig
    wte: Any
    wpe: Any
    lm_head: Any
    attn_wq: Any
    attn_wk: Any
    attn_wv: Any
    attn_wo: Any
    mlp_fc1: Any
    mlp_fc2: Any

    def __post_init__(self) -> None:
        if not isinstance(self.config, GPTConfig):
            raise TypeError(f"Params.config must be a GPTConfig, got {type(self.config).__name__}")
        arrays = [getattr(self, name) for name in FIELDS]
        try:
            xp = _xp.array_namespace(*arrays)
        except TypeError as exc:
            raise TypeError(f"Params fields must be arrays of one namespace: {exc}") from exc
        for name, shape in field_shapes(self.config).items():
            got = tuple(getattr(self, name).shape)
            if got != shape:
                raise ValueError(
                    f"Params.{name} has shape {got}, but the config needs {shape} ({self.config})"
                )
        first = arrays[0]
        if any(a.dtype != first.dtype for a in arrays):
            raise TypeError(
                f"Params fields must share one dtype, got {sorted({str(a.dtype) for a in arrays})}"
            )
        if first.dtype not in (xp.float32, xp.float64):
            # float16 and other floats: no part of the library (checkpoints included) keeps them
            raise TypeError(f"Params must be float32 or float64, got {first.dtype}")
        dev = array_api_compat.device(first)
        if any(array_api_compat.device(a) != dev for a in arrays):
            raise ValueError(
                f"Params fields must share one device, got {sorted({str(array_api_compat.device(a)) for a in arrays})}"
            )

    # -- properties ---------------------------------------------------------------
    @property
    def xp(self) -> Any:
        """The Array API namespace of the weights."""
        return _xp.array_namespace(self.wte)

    @property
    def device(self) -> Any:
        """The device of the weights."""
        return array_api_compat.device(self.wte)

    @property
    def dtype(self) -> Any:
        """The dtype of the weights (a dtype object of ``xp``)."""
        return self.wte.dtype

    @property
    def backend(self) -> str:
        """The backend name of the weights (``"numpy"``, ``"dask"``, ...)."""
        return _xp.backend_of(self.wte)

    def arrays(self) -> dict[str, Any]:
        """The fields as a dict ``name -> array`` in the spec's order."""
        return {name: getattr(self, name) for name in FIELDS}

    # -- building new records -----------------------------------------------------
    def map(self, fn: Callable[..., Any], *others: Params, check: bool = True) -> Params:
        """A new ``Params`` whose field ``f`` is ``fn(self.f, other1.f, …)``.

        ``check=False`` skips the validation of the result (for elementwise updates in
        hot loops, where shapes, dtype and device cannot change).
        """
        arrays = {
            name: fn(getattr(self, name), *(getattr(o, name) for o in others)) for name in FIELDS
        }
        return Params(self.config, **arrays) if check else Params.trusted(self.config, arrays)

    @classmethod
    def trusted(cls, config: GPTConfig, arrays: Mapping[str, Any]) -> Params:
        """Build a record without validating it; only for arrays known to fit ``config``
        (results of the model's own elementwise or backward computations)."""
        obj = object.__new__(cls)
        object.__setattr__(obj, "config", config)
        for name in FIELDS:
            object.__setattr__(obj, name, arrays[name])
        return obj

    def to(self, backend: Any = None, *, device: Any = None, dtype: str | None = None) -> Params:
        """Copy to another backend, device and/or dtype (through host NumPy arrays).

        ``backend`` is a table name (``"numpy"``, ``"torch"``, ...) or an Array API
        namespace (a module such as ``ndonnx``, or a namespace object); the weights go
        there with its ``asarray``. ``backend=None`` keeps the current backend and,
        unless ``device`` is given, the current device; ``dtype=None`` the current dtype.
        Leaving a namespace whose values cannot be copied to the host (neither DLPack nor
        ``__array__``) is a ``TypeError``.
        """
        if backend is None and device is None:
            device = self.device
        backend = self.backend if backend is None else _xp.check_backend(backend)
        dtype = _xp.dtype_name(self.wte) if dtype is None else _xp.check_dtype(dtype)
        return Params(
            self.config,
            **{
                name: _xp.asarray(_xp.to_numpy(a), backend, device=device, dtype=dtype)
                for name, a in self.arrays().items()
            },
        )

    # -- the original's layout --------------------------------------------------------
    def to_state_dict(self) -> dict[str, np.ndarray]:
        """The weights in the original's layout and names, as NumPy arrays:
        ``"wte" [V, C]``, ``"wpe" [T, C]``, ``"lm_head" [V, C]``, ``"layer{i}.attn_wq" [C, C]``, …,
        ``"layer{i}.mlp_fc2" [C, 4C]``, in the original's key order."""
        host = {name: _xp.to_numpy(a) for name, a in self.arrays().items()}
        out = {name: host[name] for name in GLOBAL_FIELDS}
        for i in range(self.config.n_layer):
            for name in LAYER_FIELDS:
                out[f"layer{i}.{name}"] = host[name][i]
        return out

    @classmethod
    def from_state_dict(
        cls,
        state_dict: Mapping[str, Any],
        *,
        config: GPTConfig | None = None,
        backend: Any = "numpy",
        device: Any = None,
        dtype: str | None = None,
    ) -> Params:
        """Build ``Params`` from the original's state dict (nested lists or NumPy arrays)
        on ``backend`` (a table name or an Array API namespace, as :meth:`to` takes).

        Without ``config`` it is inferred from the shapes with the default ``n_head`` (4);
        pass one where ``n_head`` differs (shapes do not tell it). ``dtype=None`` keeps a
        float32/float64 input dtype and uses float64 for lists. A ``"tokenizer"`` entry (what
        ``microgpt-xp export`` writes beside the weights) is passed over. Missing or extra keys, wrong
        shapes and non-finite values raise ``ValueError``.
        """
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"state_dict must be a mapping, got {type(state_dict).__name__}")
        host = {
            k: np.asarray(_xp.to_numpy(v) if _is_array(v) else v)
            for k, v in state_dict.items()
            if k != TOKENIZER_KEY  # what `microgpt-xp export` adds beside the weights
        }
        if config is None:
            config = _infer_config(host)
        expected = state_dict_keys(config)
        missing = [k for k in expected if k not in host]
        extra = [k for k in host if k not in expected]
        if missing or extra:
            raise ValueError(
                f"state dict does not match {config}: missing keys {missing}, extra keys {extra}"
            )
        shapes = field_shapes(config)
        for key in expected:
            name = key.split(".")[-1]
            want = shapes[name][1:] if name in LAYER_FIELDS else shapes[name]
            if host[key].shape != want:
                raise ValueError(
                    f"state dict entry {key!r} has shape {host[key].shape}, expected {want}"
                )
        bad = [k for k in expected if not np.isfinite(np.asarray(host[k], dtype=np.float64)).all()]
        if bad:
            raise ValueError(f"state dict entries {bad} are not finite (NaN or inf)")
        if dtype is None:
            kinds = {str(host[k].dtype) for k in expected}
            dtype = (
                kinds.pop() if len(kinds) == 1 and kinds <= {"float32", "float64"} else "float64"
            )
        stacked = {name: host[name] for name in GLOBAL_FIELDS}
        for name in LAYER_FIELDS:
            stacked[name] = np.stack([host[f"layer{i}.{name}"] for i in range(config.n_layer)])
        return from_host(stacked, config, backend=backend, device=device, dtype=dtype)


_pytree.register(
    Params,
    lambda p: (tuple(getattr(p, name) for name in FIELDS), p.config),
    lambda config, arrays: Params.trusted(config, dict(zip(FIELDS, arrays, strict=True))),
)


def _is_array(v: Any) -> bool:
    return bool(array_api_compat.is_array_api_obj(v)) and not isinstance(v, np.ndarray)


def _infer_config(host: Mapping[str, np.ndarray]) -> GPTConfig:
    for key in ("wte", "wpe"):
        if key not in host or host[key].ndim != 2:
            raise ValueError(f"state dict needs a 2-d {key!r} entry to infer the config")
    layers = {k.split(".")[0] for k in host if k.startswith("layer")}
    return GPTConfig(
        vocab_size=int(host["wte"].shape[0]),
        n_embd=int(host["wte"].shape[1]),
        block_size=int(host["wpe"].shape[0]),
        n_layer=max(len(layers), 1),
    )


def from_host(
    host: Mapping[str, np.ndarray], config: GPTConfig, *, backend: Any, device: Any, dtype: str
) -> Params:
    """``Params`` from a dict of layer-stacked NumPy arrays, placed on a backend/device/dtype."""
    _xp.check_backend(backend)
    _xp.check_dtype(dtype)
    return Params(
        config,
        **{name: _xp.asarray(host[name], backend, device=device, dtype=dtype) for name in FIELDS},
    )


def init_params(
    config: GPTConfig,
    *,
    seed: int = 0,
    backend: Any = "numpy",
    device: Any = None,
    dtype: str = "float32",
) -> Params:
    """Fresh weights drawn from N(0, 0.08²) by a seeded host ``numpy.random.Generator``,
    placed on ``backend`` (a table name or an Array API namespace, as :meth:`Params.to`
    takes) and ``device``.

    One flat draw of ``config.num_params`` values is split over the fields in the
    spec's state-dict order, so a seed gives the same weights on every backend, device
    and dtype (up to the dtype's rounding).
    """
    if not isinstance(config, GPTConfig):
        raise TypeError(f"config must be a GPTConfig, got {type(config).__name__}")
    _xp.check_backend(backend)
    _xp.check_dtype(dtype)
    flat = np.random.default_rng(seed).normal(0.0, INIT_STD, size=config.num_params)
    state: dict[str, np.ndarray] = {}
    offset = 0
    shapes = field_shapes(config)
    for key in state_dict_keys(config):
        shape = shapes[key.split(".")[-1]]
        shape = shape[1:] if key.startswith("layer") else shape
        size = int(np.prod(shape))
        state[key] = flat[offset : offset + size].reshape(shape)
        offset += size
    return Params.from_state_dict(state, config=config, backend=backend, device=device, dtype=dtype)


def layout(config: GPTConfig) -> tuple[tuple[str, int, int, tuple[int, ...]], ...]:
    """``(name, start, stop, shape)`` of every field in :func:`flatten`'s vector."""
    return _layout(config)


@functools.cache
def _layout(config: GPTConfig) -> tuple[tuple[str, int, int, tuple[int, ...]], ...]:
    out, offset = [], 0
    for name, shape in field_shapes(config).items():
        size = math.prod(shape)
        out.append((name, offset, offset + size, tuple(shape)))
        offset += size
    return tuple(out)


def flatten(record: Params) -> Any:
    """The fields of ``record`` one after another as one ``(num_params,)`` array of its
    namespace (in :data:`FIELDS` order, each field row-major)."""
    # axis=None flattens each array: one call where a reshape per field costs more
    return record.xp.concat([getattr(record, name) for name in FIELDS], axis=None)


def unflatten(flat: Any, config: GPTConfig) -> Params:
    """The inverse of :func:`flatten`: a ``Params`` whose fields are reshaped slices of
    ``flat (num_params,)`` (views where the namespace has them)."""
    xp = _xp.array_namespace(flat)
    fields = {
        name: xp.reshape(flat[start:stop], shape) for name, start, stop, shape in _layout(config)
    }
    return Params.trusted(config, fields)


def materialize(*items: Any) -> tuple[Any, ...]:
    """Evaluate arrays and records (``Params``, ``AdamState``, any dataclass of arrays and
    records) together — one Dask computation whose results stay in memory — so that a
    training loop's graph does not grow; a no-op on eager backends. Returns the items in
    the same order and structure."""
    flat: list[Any] = []
    for item in items:
        _collect(item, flat)
    if not any(_xp.is_lazy(a) for a in flat):
        return items  # the very same objects
    done = iter(_xp.persist(flat))
    return tuple(_rebuild(item, done) for item in items)


def _collect(item: Any, out: list[Any]) -> None:
    if isinstance(item, Params):
        out.extend(item.arrays().values())
    elif dataclasses.is_dataclass(item) and not isinstance(item, type):
        for f in dataclasses.fields(item):
            _collect(getattr(item, f.name), out)
    elif isinstance(item, tuple):
        for x in item:
            _collect(x, out)
    else:
        out.append(item)


def _rebuild(item: Any, done: Any) -> Any:
    if isinstance(item, Params):
        return Params.trusted(item.config, {name: next(done) for name in FIELDS})
    if dataclasses.is_dataclass(item) and not isinstance(item, type):
        return dataclasses.replace(
            item,
            **{f.name: _rebuild(getattr(item, f.name), done) for f in dataclasses.fields(item)},
        )
    if isinstance(item, tuple):
        return tuple(_rebuild(x, done) for x in item)
    return next(done)
