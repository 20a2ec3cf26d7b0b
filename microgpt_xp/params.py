"""The record of weights: ``Params``, its initialisation and its moves between namespaces."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import array_api_compat
import numpy as np

from . import _pytree, _xp
from ._errors import ArgumentTypeError, ArgumentValueError
from .config import GPTConfig

#: Global weights, then per-layer weights (stacked along a leading ``n_layer`` axis), in
#: the spec's state-dict order.
GLOBAL_FIELDS: tuple[str, ...] = ("wte", "wpe", "lm_head")
LAYER_FIELDS: tuple[str, ...] = ("attn_wq", "attn_wk", "attn_wv", "attn_wo", "mlp_fc1", "mlp_fc2")
FIELDS: tuple[str, ...] = GLOBAL_FIELDS + LAYER_FIELDS

#: The entry in which an exported state dict carries its tokenizer (``{"chars": ...}``).
TOKENIZER_KEY = "tokenizer"

#: Standard deviation of the initial Gaussian weights (the spec's 0.08).
INIT_STD = 0.08


def field_shapes(config: GPTConfig) -> dict[str, tuple[int, ...]]:
    """Shape of every ``Params`` field for ``config`` (matrices are ``[n_out, n_in]``)."""
    v, c, t, n = config.vocab_size, config.n_embd, config.block_size, config.n_layer
    square = (n, c, c)
    return {
        "wte": (v, c),
        "wpe": (t, c),
        "lm_head": (v, c),
        **dict.fromkeys(("attn_wq", "attn_wk", "attn_wv", "attn_wo"), square),
        "mlp_fc1": (n, 4 * c, c),
        "mlp_fc2": (n, c, 4 * c),
    }


def state_dict_shapes(config: GPTConfig) -> dict[str, tuple[int, ...]]:
    """The original's state-dict keys in its order (``wte, wpe, lm_head, layer0.attn_wq, …,
    layer0.mlp_fc2, layer1.attn_wq, …``) with their shapes."""
    shapes = field_shapes(config)
    out = {name: shapes[name] for name in GLOBAL_FIELDS}
    for i in range(config.n_layer):
        out.update({f"layer{i}.{name}": shapes[name][1:] for name in LAYER_FIELDS})
    return out


def state_dict_keys(config: GPTConfig) -> list[str]:
    """The keys of :func:`state_dict_shapes`, in the original's order."""
    return list(state_dict_shapes(config))


def check_placement(backend: Any, device: Any = None, dtype: str | None = None) -> str:
    """The name of ``backend`` (a table name or an Array API namespace), once it, ``device``
    and ``dtype`` (a name; ``None`` passes) are usable: otherwise an ``ArgumentValueError``
    or ``ArgumentTypeError`` naming the one that is not (raised by :mod:`microgpt_xp._xp`)."""
    name = _xp.check_backend(backend)
    _xp.resolve_device(name, device)
    if dtype is not None:
        _xp.check_dtype(dtype)
    return name


@dataclass(frozen=True)
class Params:
    """microgpt's weights, every field an array of one namespace, device and dtype
    (float32 or float64).

    Fields (``V`` vocab, ``T`` block_size, ``C`` n_embd, ``L`` n_layer):
    ``wte [V, C]``, ``wpe [T, C]``, ``lm_head [V, C]``, ``attn_wq/attn_wk/attn_wv/attn_wo
    [L, C, C]``, ``mlp_fc1 [L, 4C, C]``, ``mlp_fc2 [L, C, 4C]``. Matrices are ``[n_out,
    n_in]`` as in the original (``y = x @ W.T``). The same record holds gradients and Adam
    moments; it is immutable (see :meth:`map`).
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
            raise ArgumentTypeError(
                "config", f"Params.config must be a GPTConfig, got {type(self.config).__name__}"
            )
        arrays = list(self.arrays().values())
        try:
            xp = _xp.array_namespace(*arrays)
        except TypeError as exc:
            raise TypeError(f"Params fields must be arrays of one namespace: {exc}") from exc
        for name, shape in field_shapes(self.config).items():
            got = tuple(getattr(self, name).shape)
            if got != shape:
                raise ArgumentValueError(
                    name,
                    f"Params.{name} has shape {got}, but the config needs {shape} ({self.config})",
                )
        dtypes = {str(a.dtype) for a in arrays}
        if len(dtypes) > 1:
            raise TypeError(f"Params fields must share one dtype, got {sorted(dtypes)}")
        if arrays[0].dtype not in (xp.float32, xp.float64):
            raise TypeError(f"Params must be float32 or float64, got {arrays[0].dtype}")
        devices = {str(array_api_compat.device(a)) for a in arrays}
        if len(devices) > 1:
            raise ValueError(f"Params fields must share one device, got {sorted(devices)}")

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

    def map(self, fn: Callable[..., Any], *others: Params, check: bool = True) -> Params:
        """A new ``Params`` whose field ``f`` is ``fn(self.f, other1.f, …)``; ``check=False``
        skips validating the result (elementwise updates in hot loops)."""
        arrays = {
            name: fn(getattr(self, name), *(getattr(o, name) for o in others)) for name in FIELDS
        }
        return Params(self.config, **arrays) if check else Params.trusted(self.config, arrays)

    @classmethod
    def trusted(cls, config: GPTConfig, arrays: Mapping[str, Any]) -> Params:
        """A record of ``arrays`` (a mapping with every field) without validation: only for
        arrays known to fit ``config`` (results of the model's own computations)."""
        obj = object.__new__(cls)
        object.__setattr__(obj, "config", config)
        for name in FIELDS:
            object.__setattr__(obj, name, arrays[name])
        return obj

    def to(self, backend: Any = None, *, device: Any = None, dtype: str | None = None) -> Params:
        """A copy on another backend (a table name or an Array API namespace), device and/or
        dtype, through host NumPy arrays. ``backend=None`` keeps the backend and, unless
        ``device`` is given, the device; ``dtype=None`` keeps the dtype."""
        if backend is None and device is None:
            device = self.device
        return from_host(
            {name: _xp.to_numpy(a) for name, a in self.arrays().items()},
            self.config,
            backend=self.backend if backend is None else backend,
            device=device,
            dtype=_xp.dtype_name(self.wte) if dtype is None else dtype,
        )

    def to_state_dict(self) -> dict[str, np.ndarray]:
        """The weights in the original's layout, keys and order, as NumPy arrays:
        ``"wte" [V, C]``, ``"wpe" [T, C]``, ``"lm_head" [V, C]``, ``"layer{i}.attn_wq" [C, C]``,
        …, ``"layer{i}.mlp_fc2" [C, 4C]``."""
        host = {name: _xp.to_numpy(a) for name, a in self.arrays().items()}
        out = {name: host[name] for name in GLOBAL_FIELDS}
        for i in range(self.config.n_layer):
            out.update({f"layer{i}.{name}": host[name][i] for name in LAYER_FIELDS})
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
        """``Params`` from the original's state dict (nested lists or arrays of any
        namespace) on ``backend`` and ``device``.

        Without ``config`` it is inferred from the shapes with the default ``n_head`` (4).
        ``dtype=None`` keeps a float32/float64 input dtype, float64 otherwise. A
        ``"tokenizer"`` entry is passed over. Missing or extra keys, wrong shapes and
        non-finite values raise ``ValueError``.
        """
        if not isinstance(state_dict, Mapping):
            raise ArgumentTypeError(
                "state_dict", f"state_dict must be a mapping, got {type(state_dict).__name__}"
            )
        host = {
            k: np.asarray(_xp.to_numpy(v) if array_api_compat.is_array_api_obj(v) else v)
            for k, v in state_dict.items()
            if k != TOKENIZER_KEY
        }
        if config is None:
            for key in ("wte", "wpe"):
                if key not in host or host[key].ndim != 2:
                    raise ArgumentValueError(
                        "state_dict", f"state dict needs a 2-d {key!r} entry to infer the config"
                    )
            (v, c), t = host["wte"].shape, host["wpe"].shape[0]
            layers = {k.split(".")[0] for k in host if k.startswith("layer")}
            config = GPTConfig(int(v), n_layer=max(len(layers), 1), n_embd=int(c), block_size=t)
        expected = state_dict_shapes(config)
        missing = [k for k in expected if k not in host]
        extra = [k for k in host if k not in expected]
        if missing or extra:
            raise ArgumentValueError(
                "state_dict",
                f"state dict does not match {config}: missing keys {missing}, extra keys {extra}",
            )
        for key, want in expected.items():
            if host[key].shape != want:
                raise ArgumentValueError(
                    "state_dict",
                    f"state dict entry {key!r} has shape {host[key].shape}, expected {want}",
                )
        bad = [k for k in expected if not np.isfinite(host[k].astype(np.float64)).all()]
        if bad:
            raise ArgumentValueError(
                "state_dict", f"state dict entries {bad} are not finite (NaN or inf)"
            )
        if dtype is None:
            kinds = {str(host[k].dtype) for k in expected}
            dtype = kinds.pop() if kinds in ({"float32"}, {"float64"}) else "float64"
        stacked = {name: host[name] for name in GLOBAL_FIELDS}
        for name in LAYER_FIELDS:
            stacked[name] = np.stack([host[f"layer{i}.{name}"] for i in range(config.n_layer)])
        return from_host(stacked, config, backend=backend, device=device, dtype=dtype)


_pytree.register(
    Params,
    lambda p: (tuple(p.arrays().values()), p.config),
    lambda config, arrays: Params.trusted(config, dict(zip(FIELDS, arrays, strict=True))),
)


def from_host(
    host: Mapping[str, np.ndarray], config: GPTConfig, *, backend: Any, device: Any, dtype: str
) -> Params:
    """``Params`` of layer-stacked host arrays (``name -> array``), placed on ``backend``,
    ``device`` and ``dtype`` (checked by :func:`check_placement`)."""
    backend = check_placement(backend, device, dtype)
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
    """Fresh weights drawn from N(0, 0.08²) by ``numpy.random.default_rng(seed)`` on the host,
    placed on ``backend`` (a table name or an Array API namespace), ``device`` and ``dtype``.

    One flat draw of ``config.num_params`` values is split over the state-dict keys in the
    spec's order, so a seed gives the same weights everywhere (up to the dtype's rounding).
    """
    if not isinstance(config, GPTConfig):
        raise ArgumentTypeError(
            "config", f"config must be a GPTConfig, got {type(config).__name__}"
        )
    flat = np.random.default_rng(seed).normal(0.0, INIT_STD, size=config.num_params)
    state, offset = {}, 0
    for key, shape in state_dict_shapes(config).items():
        state[key] = flat[offset : offset + math.prod(shape)].reshape(shape)
        offset += math.prod(shape)
    return Params.from_state_dict(state, config=config, backend=backend, device=device, dtype=dtype)


@functools.cache
def layout(config: GPTConfig) -> tuple[tuple[str, int, int, tuple[int, ...]], ...]:
    """``(name, start, stop, shape)`` of every field in :func:`flatten`'s vector."""
    out, offset = [], 0
    for name, shape in field_shapes(config).items():
        out.append((name, offset, offset + math.prod(shape), shape))
        offset += math.prod(shape)
    return tuple(out)


def flatten(record: Params) -> Any:
    """The fields of ``record`` one after another (in :data:`FIELDS` order, each row-major)
    as one ``(num_params,)`` array of its namespace."""
    return record.xp.concat(list(record.arrays().values()), axis=None)


def unflatten(flat: Any, config: GPTConfig) -> Params:
    """The inverse of :func:`flatten`: ``Params`` of reshaped slices of ``flat (num_params,)``
    (views where the namespace has them)."""
    xp = _xp.array_namespace(flat)
    fields = {name: xp.reshape(flat[lo:hi], shape) for name, lo, hi, shape in layout(config)}
    return Params.trusted(config, fields)


def materialize(*items: Any) -> tuple[Any, ...]:
    """Evaluate the arrays of ``items`` (arrays, ``Params``, dataclasses and tuples of them)
    in one Dask computation whose results stay in memory, so that a training loop's graph
    does not grow; returns ``items`` rebuilt (the very same objects on eager backends)."""
    flat = list(_leaves(items))
    if not any(_xp.is_lazy(a) for a in flat):
        return items
    done = iter(_xp.persist(flat))
    return tuple(_rebuild(item, done) for item in items)


def _leaves(item: Any) -> Iterator[Any]:
    if isinstance(item, Params):
        yield from item.arrays().values()
    elif dataclasses.is_dataclass(item) and not isinstance(item, type):
        for f in dataclasses.fields(item):
            yield from _leaves(getattr(item, f.name))
    elif isinstance(item, tuple):
        for x in item:
            yield from _leaves(x)
    else:
        yield item


def _rebuild(item: Any, done: Iterator[Any]) -> Any:
    if isinstance(item, Params):
        return Params.trusted(item.config, {name: next(done) for name in FIELDS})
    if dataclasses.is_dataclass(item) and not isinstance(item, type):
        fields = dataclasses.fields(item)
        return dataclasses.replace(
            item, **{f.name: _rebuild(getattr(item, f.name), done) for f in fields}
        )
    if isinstance(item, tuple):
        return tuple(_rebuild(x, done) for x in item)
    return next(done)
