"""Namespaces, devices and host transfers, through the table of backends
(:data:`microgpt_xp._backends.BACKENDS`): the names a user types become a namespace and a
device; host data moves onto a backend and back; and the few questions the standard
cannot answer (is this array lazy, which backend is it) get answered.
"""

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
#: The entries of namespaces outside the table that have been met, by name.
_FOREIGN: dict[str, Backend] = {}


def check_backend(backend: Any) -> str:
    """The name of a backend given by name (``"numpy"``, ...) or as an Array API namespace
    (a module, or an object as ``array_api_compat.array_namespace`` returns); a namespace
    outside the table gets a generic entry named by its ``__name__``. ``ValueError`` for
    an unknown name, ``TypeError`` for anything else."""
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
    """The Array API namespace of a backend name or namespace, imported on first use
    (``ImportError`` saying what to install when it is missing)."""
    name = check_backend(backend)
    if name in _FOREIGN:
        return _FOREIGN[name].namespace_object
    return _table_namespace(name)


def resolve_device(backend: Any, device: Any = None) -> Any:
    """A user's device (``None``: the default; a string such as ``"cuda:0"``; an int GPU
    index; a device object) as the backend's device object (``ValueError`` if unknown)."""
    namespace(backend)  # a missing backend is an ImportError, not an unknown device
    return entry(backend).parse_device(device)


def asarray(
    host: Any, backend: Any, *, device: Any = None, dtype: str | None = None, chunks: Any = None
) -> Any:
    """Host data (lists or a NumPy array) on ``backend``/``device`` as ``dtype`` (a name;
    ``None`` keeps the host's), in ``chunks`` on chunked backends (default: one chunk)."""
    host = np.asarray(host) if dtype is None else np.asarray(host, dtype=dtype)
    return entry(backend).from_host(host, resolve_device(backend, device), chunks)


def to_batch(
    tokens: Any, lengths: Any, backend: Any, *, device: Any = None, chunk_size: int | None = None
) -> tuple[Any, Any]:
    """A host batch ``(tokens (B, L), lengths (B,))`` on a backend, on chunked ones in
    chunks of ``chunk_size`` rows (default one chunk)."""
    chunks_t = None if chunk_size is None else (chunk_size, -1)
    chunks_l = None if chunk_size is None else (chunk_size,)
    return (
        asarray(tokens, backend, device=device, chunks=chunks_t),
        asarray(lengths, backend, device=device, chunks=chunks_l),
    )


def backend_of(x: Any) -> str:
    """The backend name of an array (``"numpy"``, ..., or a namespace's, e.g. ``"ndonnx"``)."""
    if isinstance(x, np.ndarray):  # first: a new Dask worker may be importing dask.array
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
    """``kind(x)`` (``float``, ``int`` or ``bool``) of a 0-d array or a number; ``None``
    where the value cannot be read (a tracer, a symbolic array such as ndonnx's)."""
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


def _laziness(x: Any) -> tuple[bool, bool]:
    """``(lazy, traced)`` of an array; ``(False, False)`` for a number."""
    try:
        spec = entry(backend_of(x))
    except TypeError:
        return False, False
    traced = spec.is_traced is not None and spec.is_traced(x)
    return spec.lazy or traced, traced


def is_traced(x: Any) -> bool:
    """True for tracers of a compiler (``jax.jit``)."""
    return _laziness(x)[1]


def is_lazy(x: Any) -> bool:
    """True for arrays of a table backend whose values are not known without a compute
    (Dask) or at all (tracers); False for eager arrays, numbers and unknown namespaces."""
    return _laziness(x)[0]


def lazy_value_check(x: Any, check: Any, message: str) -> Any:
    """``x`` with ``check(block) -> bool`` run on its blocks when computed (``ValueError(message)``
    if False) on chunked lazy backends; other arrays unchanged."""
    spec = entry(backend_of(x))
    return x if spec.attach_check is None else spec.attach_check(x, check, message)


def persist(arrays: list[Any]) -> list[Any]:
    """``arrays`` with the lazy ones evaluated in one computation per backend and held in
    memory (Dask's ``persist``: a training loop's graph does not grow); others as they are."""
    out, groups = list(arrays), dict[str, list[int]]()
    for i, a in enumerate(arrays):
        if is_lazy(a):
            groups.setdefault(backend_of(a), []).append(i)
    for name, picked in groups.items():
        if (run := entry(name).persist) is not None:
            for i, done in zip(picked, run([arrays[i] for i in picked]), strict=True):
                out[i] = done
    return out


def check_positive_int(value: Any, name: str, *, least: int = 1) -> int:
    """``value`` if it is an ``int`` (not a ``bool``) of at least ``least``, else
    :class:`ArgumentValueError` about ``name``, the argument's name (``"batch_size"``)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        kind = "positive" if least == 1 else "non-negative"
        raise ArgumentValueError(name, f"{name} must be a {kind} int, got {value!r}")
    return value


def check_nonnegative_int(value: Any, name: str) -> int:
    """:func:`check_positive_int` for an ``int`` of at least 0 (a seed)."""
    return check_positive_int(value, name, least=0)


def check_jit(jit: Any) -> bool | None:
    """``jit`` if it is ``None``, ``True`` or ``False``, else ``TypeError``."""
    if jit is not None and not isinstance(jit, bool):
        raise ArgumentTypeError("jit", f"jit must be None, True or False, got {jit!r}")
    return jit


def compiler(backend: str, jit: bool | None) -> Callable[[F], F] | None:
    """``backend``'s compiler (``fn -> compiled fn``) or ``None`` (eager): ``jit=None``
    compiles where there is one, ``False`` never, ``True`` always (else ``ValueError``)."""
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
    """``fn`` (a module-level function) compiled by ``backend``'s compiler, once per
    function and backend so that the compiler's cache is kept between calls."""
    compile_fn = entry(backend).compile
    assert compile_fn is not None
    return compile_fn(fn)


_NAMESPACES: dict[type, Any] = {}


def is_integral(xp: Any, dtype: Any) -> bool:
    """``xp.isdtype(dtype, "integral")``, cached (array-api-compat's answer costs µs)."""
    try:
        return _is_integral_cached(xp, dtype)
    except TypeError:  # an unhashable dtype
        return bool(xp.isdtype(dtype, "integral"))


@functools.lru_cache(maxsize=64)
def _is_integral_cached(xp: Any, dtype: Any) -> bool:
    return bool(xp.isdtype(dtype, "integral"))


def array_namespace(*arrays: Any) -> Any:
    """``array_api_compat.array_namespace``, cached per array type (a dict hit instead of
    ~9 µs on every block) when all arrays share one type."""
    kind = type(arrays[0])
    for a in arrays[1:]:
        if type(a) is not kind:
            return array_api_compat.array_namespace(*arrays)
    ns = _NAMESPACES.get(kind)
    if ns is None:
        numpy = kind is np.ndarray
        ns = namespace("numpy") if numpy else array_api_compat.array_namespace(arrays[0])
        _NAMESPACES[kind] = ns
    return ns
