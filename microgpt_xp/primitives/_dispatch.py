"""How a primitive picks its implementation (:func:`native_module`, :func:`overridable`)."""

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
    (array_api_compat.is_ndonnx_array, "_ndonnx"),
)
_PACKAGE = __name__.rsplit(".", 1)[0]


def native_module(x: Any) -> ModuleType | None:
    """The override module of inputs like ``x`` (array-api-compat's ``is_*_array``) or None."""
    for test, name in _MODULES:
        if test(x):
            return importlib.import_module(f"{_PACKAGE}.{name}")
    return None


def writable(x: Any) -> bool:
    """Whether ``x`` can be written in place (eager and writeable: not JAX's, not Dask's)."""
    return bool(array_api_compat.is_writeable_array(x) and not array_api_compat.is_lazy_array(x))


def overridable(arg: int = 0) -> Callable[[F], F]:
    """Call the same-named override of argument ``arg``'s :func:`native_module`, if any (cached
    per array type); the generic body stays ``__wrapped__``."""

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
