"""How a primitive picks its implementation: :func:`native_module`, the one predicate,
and :func:`overridable`, the decorator of every generic primitive."""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any, TypeVar

import array_api_compat

F = TypeVar("F", bound=Callable[..., Any])

#: The override modules, by the array-api-compat test that selects them.
_MODULES: tuple[tuple[Callable[[Any], bool], str], ...] = (
    (array_api_compat.is_numpy_array, "_numpy"),
    (array_api_compat.is_torch_array, "_torch"),
    (array_api_compat.is_jax_array, "_jax"),
    (array_api_compat.is_cupy_array, "_cupy"),
    (array_api_compat.is_dask_array, "_dask"),
    (lambda x: type(x).__module__.startswith("ndonnx."), "_ndonnx"),
)
_PACKAGE = __name__.rsplit(".", 1)[0]


def native_module(x: Any) -> ModuleType | None:
    """The module of overrides that inputs like ``x`` take (the first whose array-api-compat
    ``is_*_array`` test ``x`` passes: NumPy subclasses, JAX tracers included), or ``None``."""
    for test, name in _MODULES:
        if test(x):
            return importlib.import_module(f"{_PACKAGE}.{name}")
    return None


def writable(x: Any) -> bool:
    """Whether ``x`` can be written in place: an eager array whose library allows it
    (NumPy, PyTorch, CuPy, array-api-strict; not JAX's, not Dask's)."""
    return bool(array_api_compat.is_writeable_array(x) and not array_api_compat.is_lazy_array(x))


def overridable(arg: int = 0) -> Callable[[F], F]:
    """Make a generic primitive call the override of the namespace of its argument ``arg``
    (:func:`native_module`), where that module defines a function of the same name; the
    choice is cached per array type. The generic body stays reachable as ``__wrapped__``."""

    def decorate(generic: F) -> F:
        name = generic.__name__
        chosen: dict[type, Callable[..., Any]] = {}

        @functools.wraps(generic)
        def call(*args: Any, **kwargs: Any) -> Any:
            kind = type(args[arg])
            impl = chosen.get(kind)
            if impl is None:
                module = native_module(args[arg])
                impl = chosen[kind] = getattr(module, name, generic) if module else generic
            return impl(*args, **kwargs)

        return call  # type: ignore[return-value]

    return decorate
