"""The record of weights: ``Params``, its initialisation and its moves between namespaces."""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import array_api_compat
import numpy as np

from . import _pytree, _xp
from ._errors import ArgumentTypeError, ArgumentValueError
from .config import GPTConfig

#: Global weights, then per-layer weights (stacked on a leading ``n_layer`` axis), in the
#: spec's state-dict order.
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
    sq = (n, c, c)
    return dict(
        zip(
            FIELDS,
            [(v, c), (t, c), (v, c), sq, sq, sq, sq, (n, 4 * c, c), (n, c, 4 * c)],
            strict=True,
        )
    )


def state_dict_shapes(config: GPTConfig) -> dict[str, tuple[int, ...]]:
    """The original's state-dict keys in its order (``wte, wpe, lm_head, layer0.attn_wq, …,
    layer1.attn_wq, …``) with their shapes."""
    shapes = field_shapes(config)
    out = {name: shapes[name] for name in GLOBAL_FIELDS}
    for i in range(config.n_layer):
        out.update({f"layer{i}.{name}": shapes[name][1:] for name in LAYER_FIELDS})
    return out


def state_dict_keys(config: GPTConfig) -> list[str]:
    """The keys of :func:`state_dict_shapes`, in the original's order."""
    return list(state_dict_shapes(config))


def check_placement(backend: Any, device: Any = None, dtype: str | None = None) -> str:
    """The name of ``backend`` (a table name or a namespace) once it, ``device`` and
    ``dtype`` (``None`` passes) are usable; else the argument error of :mod:`._xp`."""
    name = _xp.check_backend(backend)
    _xp.resolve_device(name, device)
    if dtype is not None:
        _xp.check_dtype(dtype)
    return name


def _config(config: Any, what: str) -> None:
    if not isinstance(config, GPTConfig):
        raise ArgumentTypeError(
            "config", f"{what} must be a GPTConfig, got {type(config).__name__}"
        )


@dataclass(frozen=True)
class Params:
    """microgpt's weights, arrays of one namespace, device and dtype (float32 or float64):
    ``wte [V, C]``, ``wpe [T, C]``, ``lm_head [V, C]``, ``attn_wq/wk/wv/wo [L, C, C]``,
    ``mlp_fc1 [L, 4C, C]``, ``mlp_fc2 [L, C, 4C]`` (matrices ``[n_out, n_in]``, ``y = x @
    W.T``). The same immutable record holds gradients and Adam moments (see :meth:`map`)."""

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
        _config(self.config, "Params.config")
        arrays = list(self.arrays().values())
        try:
            xp = _xp.array_namespace(*arrays)
        except TypeError as exc:
            raise TypeError(f"Params fields must be arrays of one namespace: {exc}") from exc
        for name, shape in field_shapes(self.config).items():
            if (got := tuple(getattr(self, name).shape)) != shape:
                msg = f"Params.{name} has shape {got}, but the config needs {shape} ({self.config})"
                raise ArgumentValueError(name, msg)
        if len(dtypes := {str(a.dtype) for a in arrays}) > 1:
            raise TypeError(f"Params fields must share one dtype, got {sorted(dtypes)}")
        if arrays[0].dtype not in (xp.float32, xp.float64):
            raise TypeError(f"Params must be float32 or float64, got {arrays[0].dtype}")
        if len(devices := {str(array_api_compat.device(a)) for a in arrays}) > 1:
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
        new = {f: fn(getattr(self, f), *(getattr(o, f) for o in others)) for f in FIELDS}
        return Params(self.config, **new) if check else Params.trusted(self.config, new)

    @classmethod
    def trusted(cls, config: GPTConfig, arrays: Mapping[str, Any]) -> Params:
        """A record of ``arrays`` (every field) without validation: only for arrays known
        to fit ``config`` (results of the model's own computations)."""
        obj = object.__new__(cls)
        object.__setattr__(obj, "config", config)
        for name in FIELDS:
            object.__setattr__(obj, name, arrays[name])
        return obj

    def to(self, backend: Any = None, *, device: Any = None, dtype: str | None = None) -> Params:
        """A copy on another backend (a table name or a namespace), device and/or dtype,
        through host NumPy arrays; ``None`` keeps each (the device only if the backend is
        kept)."""
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
        """The weights in the original's keys, order and layout as NumPy arrays: ``"wte"
        [V, C]``, …, ``"layer{i}.attn_wq" [C, C]``, …, ``"layer{i}.mlp_fc2" [C, 4C]``."""
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
        namespace) on ``backend`` and ``device``. Without ``config`` it is inferred from the
        shapes (``n_head`` 4); ``dtype=None`` keeps float32/float64, else float64. A
        ``"tokenizer"`` entry is passed over; missing or extra keys, wrong shapes and
        non-finite values raise ``ValueError``."""
        if not isinstance(state_dict, Mapping):
            got = type(state_dict).__name__
            raise ArgumentTypeError("state_dict", f"state_dict must be a mapping, got {got}")
        host = {
            k: np.asarray(_xp.to_numpy(v) if array_api_compat.is_array_api_obj(v) else v)
            for k, v in state_dict.items()
            if k != TOKENIZER_KEY
        }

        def refuse(msg: str) -> ArgumentValueError:
            return ArgumentValueError("state_dict", msg)

        if config is None:
            for key in ("wte", "wpe"):
                if key not in host or host[key].ndim != 2:
                    raise refuse(f"state dict needs a 2-d {key!r} entry to infer the config")
            (v, c), t = host["wte"].shape, host["wpe"].shape[0]
            n = len({k.split(".")[0] for k in host if k.startswith("layer")})
            config = GPTConfig(int(v), n_layer=max(n, 1), n_embd=int(c), block_size=t)
        expected = state_dict_shapes(config)
        missing, extra = (
            [k for k in expected if k not in host],
            [k for k in host if k not in expected],
        )
        if missing or extra:
            raise refuse(
                f"state dict does not match {config}: missing keys {missing}, extra keys {extra}"
            )
        for key, want in expected.items():
            if host[key].shape != want:
                raise refuse(
                    f"state dict entry {key!r} has shape {host[key].shape}, expected {want}"
                )
        if bad := [k for k in expected if not np.isfinite(host[k].astype(np.float64)).all()]:
            raise refuse(f"state dict entries {bad} are not finite (NaN or inf)")
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
    """``Params`` of layer-stacked host arrays (``name -> array``) placed on ``backend``,
    ``device`` and ``dtype`` (checked by :func:`check_placement`)."""
    backend = check_placement(backend, device, dtype)
    place = _xp.asarray
    return Params(
        config, **{f: place(host[f], backend, device=device, dtype=dtype) for f in FIELDS}
    )


def init_params(
    config: GPTConfig,
    *,
    seed: int = 0,
    backend: Any = "numpy",
    device: Any = None,
    dtype: str = "float32",
    std: float = INIT_STD,
) -> Params:
    """Fresh weights from N(0, std²) (the spec's std 0.08 by default) by
    ``numpy.random.default_rng(seed)`` on the host, on ``backend``, ``device`` and
    ``dtype``: one flat draw of ``config.num_params`` values split over the state-dict keys
    in order, so a seed gives the same weights everywhere. ``std`` a positive real."""
    _config(config, "config")
    if isinstance(std, bool) or not isinstance(std, numbers.Real):
        raise ArgumentTypeError("std", f"std must be a real number, got {std!r}")
    if not (math.isfinite(std) and std > 0):
        raise ArgumentValueError("std", f"std must be positive and finite, got {std!r}")
    flat = np.random.default_rng(seed).normal(0.0, float(std), size=config.num_params)
    state, offset = {}, 0
    for key, shape in state_dict_shapes(config).items():
        state[key] = flat[offset : offset + math.prod(shape)].reshape(shape)
        offset += math.prod(shape)
    return Params.from_state_dict(state, config=config, backend=backend, device=device, dtype=dtype)


def flatten(record: Params) -> Any:
    """The fields of ``record`` one after another (:data:`FIELDS` order, each row-major)
    as one ``(num_params,)`` array of its namespace."""
    return record.xp.concat(list(record.arrays().values()), axis=None)


def unflatten(flat: Any, config: GPTConfig) -> Params:
    """The inverse of :func:`flatten`: ``Params`` of reshaped slices of ``flat (num_params,)``
    (views where the namespace has them)."""
    xp, fields, lo = _xp.array_namespace(flat), {}, 0
    for name, shape in field_shapes(config).items():
        fields[name], lo = (
            xp.reshape(flat[lo : lo + math.prod(shape)], shape),
            lo + math.prod(shape),
        )
    return Params.trusted(config, fields)


def materialize(*items: Any) -> tuple[Any, ...]:
    """Evaluate the arrays of ``items`` (arrays, ``Params``, dataclasses and tuples of them)
    in one Dask computation whose results stay in memory, so that a training loop's graph
    does not grow; returns ``items`` rebuilt (the very same objects on eager backends)."""
    flat: list[Any] = []
    _leaves(items, flat)
    if not any(_xp.is_lazy(a) for a in {type(a): a for a in flat}.values()):  # one per type
        return items
    done = iter(_xp.persist(flat))
    return tuple(_rebuild(item, done) for item in items)


def _parts(item: Any) -> dict[str, Any] | tuple[Any, ...] | None:
    """The children of a record or tuple; ``None`` for a leaf."""
    if isinstance(item, Params):
        return item.arrays()
    if dataclasses.is_dataclass(item) and not isinstance(item, type):
        return {f.name: getattr(item, f.name) for f in dataclasses.fields(item)}
    return item if isinstance(item, tuple) else None


def _leaves(item: Any, out: list[Any]) -> None:
    """Append the arrays of ``item`` to ``out``, in :func:`_rebuild`'s order (a training
    step's records hold about twenty: the walk is kept short)."""
    if isinstance(item, Params):
        out.extend(getattr(item, f) for f in FIELDS)
        return
    parts = _parts(item)
    if parts is None:
        out.append(item)
        return
    for x in parts.values() if isinstance(parts, dict) else parts:
        _leaves(x, out)


def _rebuild(item: Any, done: Iterator[Any]) -> Any:
    parts = _parts(item)
    if parts is None:
        return next(done)
    if isinstance(parts, tuple):
        return tuple(_rebuild(x, done) for x in parts)
    new = {k: _rebuild(x, done) for k, x in parts.items()}
    return (
        Params.trusted(item.config, new)
        if isinstance(item, Params)
        else dataclasses.replace(item, **new)
    )
