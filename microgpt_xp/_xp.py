"""Namespaces, devices and host transfers, through the table of backends.

Everything else in microgpt_xp takes its namespace and device from its input arrays
(:func:`array_namespace`, ``array_api_compat.device``). The functions here turn the
names a user types (``"numpy"``, ``"dask"``, ...) into a namespace and a device, move host
(NumPy) data onto a backend and back, and answer the few questions that cannot be asked
through the standard (is this array lazy, which backend is it). What differs between
backends is in :data:`microgpt_xp._backends.BACKENDS`; the only backend named here is
NumPy, in two fast paths for its arrays.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from collections.abc import Callable
from typing import Any, TypeVar

import array_api_compat
import numpy as np

from ._backends import BACKENDS as TABLE
from ._backends import Backend, generic_backend
from ._errors import ArgumentValueError

F = TypeVar("F", bound=Callable[..., Any])

#: Backend names accepted by ``backend=`` arguments and the ``--backend`` option.
BACKENDS: tuple[str, ...] = tuple(TABLE)

#: The floating dtypes the model supports.
DTYPES: tuple[str, ...] = ("float32", "float64")


#: The entries of namespaces outside the table that have been met, by name.
_FOREIGN: dict[str, Backend] = {}


def check_backend(backend: Any) -> str:
    """The name of a backend given as a table name (``"numpy"``, ``"dask"``, ...) or as an
    Array API namespace (a module such as ``numpy`` or ``ndonnx``, or a namespace object
    such as ``array_api_compat.array_namespace`` returns). A namespace of a table backend
    is that backend; any other namespace gets a generic entry
    (:func:`microgpt_xp._backends.generic_backend`), named by its ``__name__``. Raises
    ``ValueError`` for an unknown name and ``TypeError`` for anything else."""
    if isinstance(backend, str):
        if backend in TABLE or backend in _FOREIGN:
            return backend
        raise ValueError(
            f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}, or pass an "
            "Array API namespace (a module such as ndonnx)"
        )
    if not _is_namespace(backend):
        raise TypeError(
            f"backend must be a backend name or an Array API namespace, got "
            f"{type(backend).__name__} {backend!r}"
        )
    for name, spec in TABLE.items():
        if spec.is_namespace(backend):
            return name
    for name, spec in _FOREIGN.items():
        if spec.namespace_object is backend:
            return name
    spec = generic_backend(backend)
    if spec.name in _FOREIGN or spec.name in TABLE:  # another namespace of that name
        spec = dataclasses.replace(spec, name=f"{spec.name}@{id(backend):x}")
    _FOREIGN[spec.name] = spec
    return spec.name


def _is_namespace(obj: Any) -> bool:
    """Whether ``obj`` looks like an Array API namespace (it has ``asarray`` and the
    standard's dtypes)."""
    return all(hasattr(obj, attr) for attr in ("asarray", "float32", "float64", "int64"))


def check_dtype(dtype: str) -> str:
    """Return ``dtype`` if it is a supported floating dtype name, else raise ``ValueError``."""
    if dtype not in DTYPES:
        raise ValueError(f"unsupported dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    return dtype


def entry(backend: Any) -> Backend:
    """The table entry of a backend name or namespace (``ValueError`` for an unknown
    name); a generic entry for a namespace the table does not know."""
    name = check_backend(backend)
    return TABLE[name] if name in TABLE else _FOREIGN[name]


@functools.cache
def _table_namespace(backend: str) -> Any:
    spec = TABLE[backend]
    try:
        module = importlib.import_module(spec.namespace_module())
    except ImportError as exc:
        raise ImportError(f"backend {backend!r} is not installed: {spec.install} ({exc})") from exc
    if spec.setup is not None:
        spec.setup()
    return module


def namespace(backend: Any) -> Any:
    """The Array API namespace for a backend name or namespace (imported on first use).

    Raises ``ValueError`` for an unknown name and ``ImportError`` (saying what to install)
    when the backend's package is missing.
    """
    name = check_backend(backend)
    if name in _FOREIGN:
        return _FOREIGN[name].namespace_object
    return _table_namespace(name)


def resolve_device(backend: Any, device: Any = None) -> Any:
    """Turn a user's device (``None``, a string such as ``"cpu"``/``"cuda:0"``/``"device1"``,
    an int GPU index, or a backend device object) into the backend's device object.

    ``None`` means the backend's default device. Raises ``ValueError`` for a device the
    backend does not have.
    """
    namespace(backend)  # a missing backend is an ImportError, not an unknown device
    return entry(backend).parse_device(device)


def asarray(
    host: Any, backend: Any, *, device: Any = None, dtype: str | None = None, chunks: Any = None
) -> Any:
    """Move host data (nested lists or a NumPy array) onto ``backend``/``device``.

    ``dtype`` is a dtype name (``"float32"``, ``"int64"``, ...); ``None`` keeps the
    host dtype. On chunked backends (Dask), ``chunks`` sets the chunking (default: one
    chunk).
    """
    host = np.asarray(host) if dtype is None else np.asarray(host, dtype=dtype)
    return entry(backend).from_host(host, resolve_device(backend, device), chunks)


def to_batch(
    tokens: Any, lengths: Any, backend: Any, *, device: Any = None, chunk_size: int | None = None
) -> tuple[Any, Any]:
    """Move a host batch ``(tokens (B, L), lengths (B,))`` to a backend; on Dask, chunk it
    along the batch axis (``chunk_size`` rows per chunk; default one chunk)."""
    chunks_t = None if chunk_size is None else (chunk_size, -1)
    chunks_l = None if chunk_size is None else (chunk_size,)
    return (
        asarray(tokens, backend, device=device, chunks=chunks_t),
        asarray(lengths, backend, device=device, chunks=chunks_l),
    )


def backend_of(x: Any) -> str:
    """The backend name of an array (``"numpy"``, ``"dask"``, ..., or the name of a
    namespace outside the table, such as ``"ndonnx"``)."""
    if isinstance(x, np.ndarray):
        # first: a freshly started Dask worker may still be importing dask.array, and
        # the Dask check would then fail on the half-imported module
        return "numpy"
    for name, spec in TABLE.items():
        if spec.is_array(x):
            return name
    try:
        xp = array_api_compat.array_namespace(x)
    except TypeError:
        raise TypeError(f"not an array of an Array API library: {type(x).__name__}") from None
    return check_backend(xp)


def dtype_name(x: Any) -> str:
    """The name of an array's floating dtype, ``"float32"`` or ``"float64"`` (``TypeError``
    for any other)."""
    xp = array_namespace(x)
    for name in DTYPES:
        if x.dtype == getattr(xp, name):
            return name
    raise TypeError(f"expected float32 or float64 arrays, got {x.dtype}")


def to_numpy(x: Any) -> np.ndarray:
    """Copy any supported array (computing it if lazy) to a NumPy array on the host."""
    return np.asarray(entry(backend_of(x)).to_host(x))


def read_scalar(x: Any, kind: Callable[[Any], Any] = float) -> Any:
    """``kind(x)`` (``float``, ``int`` or ``bool``) of a 0-d array, or ``None`` where its
    value cannot be read: a tracer under a compiler, or a symbolic array (such as
    ndonnx's lazy ones) whose library refuses. Python numbers pass through ``kind``."""
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


def _entry_of(x: Any) -> Backend | None:
    """The entry of an array's backend, ``None`` for anything else (a Python number)."""
    try:
        return entry(backend_of(x))
    except TypeError:
        return None


def is_lazy(x: Any) -> bool:
    """True for arrays of a table backend whose values are not known without a compute
    (Dask) or at all (tracers under a compiler such as ``jax.jit``); False for eager
    arrays and Python numbers. (Whether an array of a namespace outside the table can be
    read is only known by trying: :func:`read_scalar`.)"""
    spec = _entry_of(x)
    if spec is None:
        return False
    return spec.lazy or (spec.is_traced is not None and spec.is_traced(x))


def is_traced(x: Any) -> bool:
    """True for tracers of a compiler (``jax.jit``), whose values cannot be read at all."""
    spec = _entry_of(x)
    return spec is not None and spec.is_traced is not None and spec.is_traced(x)


def lazy_value_check(x: Any, check: Any, message: str) -> Any:
    """Attach a value check to a lazy chunked array (Dask) so that it raises
    ``ValueError(message)`` when the data is computed; other arrays are returned
    unchanged. ``check`` takes one block and returns True when the block is valid."""
    spec = entry(backend_of(x))
    return x if spec.attach_check is None else spec.attach_check(x, check, message)


def persist(arrays: list[Any]) -> list[Any]:
    """Evaluate the lazy arrays among ``arrays`` in one computation per backend and keep the
    results as arrays of that backend held in memory (Dask's ``persist``), so that the
    graph of a training loop does not grow step after step; everything else (eager arrays,
    Python numbers) is returned as it is."""
    out = list(arrays)
    lazy = {i: backend_of(a) for i, a in enumerate(arrays) if is_lazy(a)}
    for name in set(lazy.values()):
        spec = entry(name)
        if spec.persist is None:
            continue
        picked = [i for i, b in lazy.items() if b == name]
        for i, done in zip(picked, spec.persist([arrays[i] for i in picked]), strict=True):
            out[i] = done
    return out


def check_positive_int(value: Any, what: str) -> int:
    """Return ``value`` if it is an ``int`` (not a ``bool``) of at least 1, else raise
    ``ValueError`` naming it as ``what``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what} must be a positive int, got {value!r}")
    return value


def check_nonnegative_int(value: Any, what: str) -> int:
    """Return ``value`` if it is an ``int`` (not a ``bool``) of at least 0 (a seed, a
    count that may be zero), else raise ``ValueError`` naming it as ``what``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ArgumentValueError(what, f"{what} must be a non-negative int, got {value!r}")
    return value


def check_jit(jit: Any) -> bool | None:
    """Return ``jit`` if it is ``None``, ``True`` or ``False``, else raise ``TypeError``."""
    if jit is not None and not isinstance(jit, bool):
        raise TypeError(f"jit must be None, True or False, got {jit!r}")
    return jit


def compiler(backend: str, jit: bool | None) -> Callable[[F], F] | None:
    """The compiler to use for ``backend`` (``fn -> compiled fn``), or ``None`` to run
    eagerly: ``jit=None`` compiles where the backend has a compiler, ``False`` never,
    ``True`` always (``ValueError`` on a backend without one)."""
    check_jit(jit)
    spec = entry(backend)
    if jit is False:
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
    """``fn`` compiled by ``backend``'s compiler, built once per function and backend (so
    that the compiler's cache of traced shapes is kept between calls). Only for
    module-level functions; ``backend`` must have a compiler."""
    compile_fn = entry(backend).compile
    assert compile_fn is not None
    return compile_fn(fn)


_NAMESPACES: dict[type, Any] = {}


def is_integral(xp: Any, dtype: Any) -> bool:
    """``xp.isdtype(dtype, "integral")``, cached per namespace and dtype (the model asks
    it of every input, and array-api-compat's answer costs microseconds)."""
    try:
        return _is_integral_cached(xp, dtype)
    except TypeError:  # an unhashable dtype
        return bool(xp.isdtype(dtype, "integral"))


@functools.lru_cache(maxsize=64)
def _is_integral_cached(xp: Any, dtype: Any) -> bool:
    return bool(xp.isdtype(dtype, "integral"))


def array_namespace(*arrays: Any) -> Any:
    """``array_api_compat.array_namespace`` with a per-type cache.

    The model calls this on every block; the cache turns a ~9 µs lookup into a dict hit
    when all arrays share one type (the namespace depends only on the array type).
    Mixed types go through ``array_api_compat.array_namespace``, which raises for arrays
    of different libraries.
    """
    kind = type(arrays[0])
    for a in arrays[1:]:
        if type(a) is not kind:
            return array_api_compat.array_namespace(*arrays)
    ns = _NAMESPACES.get(kind)
    if ns is None:
        if kind is np.ndarray:
            ns = namespace("numpy")
        else:
            ns = array_api_compat.array_namespace(arrays[0])
        _NAMESPACES[kind] = ns
    return ns
