"""Namespaces, devices and host transfers through the table of backends
(:data:`microgpt_xp._backends.BACKENDS`), and the questions the standard cannot answer."""

from __future__ import annotations

import dataclasses
import functools
import importlib
from collections.abc import Callable
from typing import Any, TypeVar

import array_api_compat
import numpy as np

from . import _pytree
from ._backends import BACKENDS as TABLE
from ._backends import Backend, generic_backend
from ._errors import ArgumentTypeError, ArgumentValueError

F = TypeVar("F", bound=Callable[..., Any])

#: Backend names accepted by ``backend=`` arguments and the ``--backend`` option.
BACKENDS: tuple[str, ...] = tuple(TABLE)
#: The floating dtypes the model supports.
DTYPES: tuple[str, ...] = ("float32", "float64")
#: The most a count that becomes a native int (a shape, a thread count) may be.
NATIVE_INT_MAX = 2**31 - 1
_FOREIGN: dict[str, Backend] = {}  # entries of namespaces outside the table, by name


def check_backend(backend: Any) -> str:
    """The name of a backend given by name or as an Array API namespace (outside the table:
    a generic entry); ``ValueError`` for an unknown name, ``TypeError`` for anything else."""
    if isinstance(backend, str):
        if backend in TABLE or backend in _FOREIGN:
            return backend
        raise ArgumentValueError(
            "backend",
            f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}, or pass an "
            "Array API namespace (a module such as ndonnx)",
        )
    if not all(hasattr(backend, a) for a in ("asarray", "float32", "float64", "int64")):
        raise ArgumentTypeError(
            "backend",
            f"backend must be a backend name or an Array API namespace, got "
            f"{type(backend).__name__} {backend!r}",
        )
    for name, spec in {**TABLE, **_FOREIGN}.items():
        if spec.is_namespace(backend):
            return name
    spec = generic_backend(backend)
    if spec.name in _FOREIGN or spec.name in TABLE:  # another namespace of that name
        spec = dataclasses.replace(spec, name=f"{spec.name}@{id(backend):x}")
    _FOREIGN[spec.name] = spec
    return spec.name


def check_dtype(dtype: str) -> str:
    """``dtype`` if it names a supported floating dtype, else ``ValueError``."""
    if dtype not in DTYPES:
        message = f"unsupported dtype {dtype!r}; choose one of {', '.join(DTYPES)}"
        raise ArgumentValueError("dtype", message)
    return dtype


def entry(backend: Any) -> Backend:
    """The entry of a backend name or namespace (a generic one outside the table)."""
    _pytree.register_pending()  # JAX may have been imported since the records were
    name = check_backend(backend)
    return TABLE[name] if name in TABLE else _FOREIGN[name]


@functools.cache
def _table_namespace(backend: str) -> Any:
    spec = TABLE[backend]
    try:
        module = importlib.import_module(spec.namespace)
    except ImportError as exc:
        raise ImportError(f"backend {backend!r} is not installed: {spec.install} ({exc})") from exc
    if spec.setup is not None:
        spec.setup()
    return module


def namespace(backend: Any) -> Any:
    """The namespace of a backend, imported on first use (``ImportError``: what to install)."""
    name = check_backend(backend)
    return _FOREIGN[name].namespace_object if name in _FOREIGN else _table_namespace(name)


def resolve_device(backend: Any, device: Any = None) -> Any:
    """A user's device (``None``, ``"cuda:0"``, a GPU index, a device) as the backend's."""
    namespace(backend)  # a missing backend is an ImportError, not an unknown device
    return entry(backend).parse_device(device)


def asarray(
    host: Any, backend: Any, *, device: Any = None, dtype: str | None = None, chunks: Any = None
) -> Any:
    """Host data on ``backend``/``device`` as ``dtype`` (``None``: the host's), in ``chunks``."""
    host = np.asarray(host) if dtype is None else np.asarray(host, dtype=dtype)
    return entry(backend).from_host(host, resolve_device(backend, device), chunks)


def to_batch(
    tokens: Any, lengths: Any, backend: Any, *, device: Any = None, chunk_size: int | None = None
) -> tuple[Any, Any]:
    """A host batch ``(tokens (B, L), lengths (B,))`` on a backend, in ``chunk_size`` rows."""
    rows = () if chunk_size is None else (chunk_size,)
    return (
        asarray(tokens, backend, device=device, chunks=(*rows, -1) if rows else None),
        asarray(lengths, backend, device=device, chunks=rows or None),
    )


def backend_of(x: Any) -> str:
    """The backend name of an array (``"numpy"``, ..., or a namespace's, e.g. ``"ndonnx"``)."""
    if isinstance(x, np.ndarray):  # first: a new Dask worker may be importing dask.array
        return "numpy"
    for name, spec in TABLE.items():
        if spec.is_array(x):
            return name
    try:
        return check_backend(array_api_compat.array_namespace(x))
    except TypeError:
        raise TypeError(f"not an array of an Array API library: {type(x).__name__}") from None


def dtype_name(x: Any) -> str:
    """``"float32"`` or ``"float64"``, an array's dtype (``TypeError`` for any other)."""
    xp = array_namespace(x)
    for name in DTYPES:
        if x.dtype == getattr(xp, name):
            return name
    raise TypeError(f"expected float32 or float64 arrays, got {x.dtype}")


def to_numpy(x: Any) -> np.ndarray:
    """A NumPy copy of any supported array (computing a lazy one)."""
    return np.asarray(entry(backend_of(x)).to_host(x))


def read_scalar(x: Any, kind: Callable[[Any], Any] = float) -> Any:
    """``kind(x)`` of a 0-d array or a number; ``None`` where it cannot be read (tracers,
    symbolic arrays such as ndonnx's)."""
    if is_traced(x):
        return None
    try:
        return kind(x)
    except (TypeError, ValueError, RuntimeError, NotImplementedError):
        if backend_of(x) in TABLE:
            raise  # a table backend that cannot convert a 0-d array is a bug, not a limit
        return None


def read_int(x: Any) -> int | None:
    """:func:`read_scalar` as an ``int``."""
    return read_scalar(x, int)  # type: ignore[no-any-return]


def _spec_of(x: Any) -> Backend | None:
    try:
        return entry(backend_of(x))
    except TypeError:  # a number
        return None


def is_traced(x: Any) -> bool:
    """True for tracers of a compiler (``jax.jit``)."""
    spec = _spec_of(x)
    return spec is not None and spec.is_traced is not None and spec.is_traced(x)


def is_lazy(x: Any) -> bool:
    """True for arrays of a table backend whose values need a compute (Dask) or a tracer."""
    spec = _spec_of(x)
    return spec is not None and (spec.lazy or is_traced(x))


def persist(arrays: list[Any]) -> list[Any]:
    """``arrays`` with the lazy ones evaluated, one computation per backend (Dask's ``persist``)."""
    out, groups = list(arrays), dict[str, list[int]]()
    for i, a in enumerate(arrays):
        if is_lazy(a):
            groups.setdefault(backend_of(a), []).append(i)
    for name, picked in groups.items():
        if (run := entry(name).persist) is not None:
            for i, done in zip(picked, run([arrays[i] for i in picked]), strict=True):
                out[i] = done
    return out


def check_positive_int(value: Any, name: str, *, least: int = 1, most: int | None = None) -> int:
    """``value`` if an ``int`` (not a ``bool``) in ``[least, most]`` (:data:`NATIVE_INT_MAX`
    where it becomes a native int), else :class:`ArgumentValueError` about ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        kind = "positive" if least == 1 else "non-negative"
        raise ArgumentValueError(name, f"{name} must be a {kind} int, got {value!r}")
    if most is not None and value > most:
        raise ArgumentValueError(name, f"{name} must be at most {most}, got {value}")
    return value


def check_nonnegative_int(value: Any, name: str, *, most: int | None = None) -> int:
    """:func:`check_positive_int` for an ``int`` of at least 0 (a seed)."""
    return check_positive_int(value, name, least=0, most=most)


def check_jit(jit: Any) -> bool | None:
    """``jit`` if it is ``None``, ``True`` or ``False``, else ``TypeError``."""
    if jit is not None and not isinstance(jit, bool):
        raise ArgumentTypeError("jit", f"jit must be None, True or False, got {jit!r}")
    return jit


def compiler(backend: str, jit: bool | None) -> Callable[[F], F] | None:
    """``backend``'s compiler or ``None`` (eager): ``jit=None`` where there is one, ``True``
    always (else ``ValueError``)."""
    spec = entry(backend)
    if check_jit(jit) is False:
        return None
    if spec.compile is None:
        if jit:
            have = [name for name, b in TABLE.items() if b.compile is not None]
            raise ValueError(
                f"jit=True: backend {spec.name!r} has no compiler (backends with one: "
                f"{', '.join(have)}); use jit=None or jit=False"
            )
        return None
    namespace(backend)  # the backend's setup runs before anything is traced
    return spec.compile  # type: ignore[return-value]


@functools.cache
def compiled(fn: Callable[..., Any], backend: str) -> Callable[..., Any]:
    """``fn`` compiled by ``backend``'s compiler, once (the compiler's cache is kept)."""
    compile_fn = entry(backend).compile
    assert compile_fn is not None
    return compile_fn(fn)


@functools.lru_cache(maxsize=64)
def _is_integral_cached(xp: Any, dtype: Any) -> bool:
    return bool(xp.isdtype(dtype, "integral"))


def is_integral(xp: Any, dtype: Any) -> bool:
    """``xp.isdtype(dtype, "integral")``, cached (array-api-compat's answer costs µs)."""
    try:
        return _is_integral_cached(xp, dtype)
    except TypeError:  # an unhashable dtype
        return bool(xp.isdtype(dtype, "integral"))


_NAMESPACES: dict[type, Any] = {}


def array_namespace(*arrays: Any) -> Any:
    """``array_api_compat.array_namespace``, cached per array type (~9 µs saved a call)."""
    kind = type(arrays[0])
    if any(type(a) is not kind for a in arrays[1:]):
        return array_api_compat.array_namespace(*arrays)
    if (ns := _NAMESPACES.get(kind)) is None:
        numpy = kind is np.ndarray
        ns = namespace("numpy") if numpy else array_api_compat.array_namespace(arrays[0])
        _NAMESPACES[kind] = ns
    return ns
