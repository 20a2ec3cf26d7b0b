"""The table of array backends: the one place that knows them by name.

One :class:`Backend` per known array library says what the runtime needs: its namespace
module, how host (NumPy) data gets there and back, its devices, its compiler and whether
its arrays are lazy or chunked. A namespace the table does not know gets a generic entry
(:func:`generic_backend`) built from the standard alone. Each library is imported inside
its functions, when it is used. The test matrix lives in noxfile.py and tests/conftest.py.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import array_api_compat
import numpy as np

from . import _pytree
from ._errors import ArgumentValueError


@dataclass(frozen=True)
class Backend:
    """One array library: ``name`` (``backend=``, ``--backend``), its ``namespace`` module,
    how to ``install`` it, and its top-level ``package`` (default: the name).

    ``parse_device`` turns a user's device (``None``, a string, an int, a device object)
    into the library's device (``ValueError`` if unknown); ``from_host(numpy_array,
    device, chunks)`` and ``to_host(array)`` move data (``chunks`` only where chunked);
    ``needs_gpu``: its arrays live on a GPU. ``setup`` runs once after the first import.
    ``compile`` is its compiler (``jax.jit``) and ``is_traced`` tells its tracers.
    ``lazy``: values need a compute (Dask), and ``persist`` evaluates a list of arrays in
    one. Chunked backends: ``attach_check(x, check, message)`` runs ``check(block)`` on
    every block when computed (``ValueError(message)`` if False), and ``chunk_meta(x)`` is
    an empty array of the chunks' type (a driver given such a backend runs one task per
    chunk). ``namespace_object``: a generic entry's namespace.
    """

    name: str
    namespace: str
    install: str
    parse_device: Callable[[Any], Any]
    from_host: Callable[[Any, Any, Any], Any] = lambda host, device, chunks: host
    to_host: Callable[[Any], Any] = np.asarray
    package: str = ""
    needs_gpu: bool = False
    setup: Callable[[], None] | None = None
    compile: Callable[[Callable[..., Any]], Callable[..., Any]] | None = None
    is_traced: Callable[[Any], bool] | None = None
    lazy: bool = False
    persist: Callable[[list[Any]], list[Any]] | None = None
    attach_check: Callable[[Any, Callable[[Any], bool], str], Any] | None = None
    chunk_meta: Callable[[Any], Any] | None = None
    namespace_object: Any = None

    def __post_init__(self) -> None:
        if not self.package:
            object.__setattr__(self, "package", self.name)

    @property
    def chunked(self) -> bool:
        """Whether its arrays are chunks of another backend's arrays (Dask)."""
        return self.chunk_meta is not None

    def is_array(self, x: Any) -> bool:
        """Whether ``x`` is an array of this backend."""
        if self.namespace_object is not None:
            try:
                return array_api_compat.array_namespace(x) is self.namespace_object
            except TypeError:
                return False
        test = getattr(array_api_compat, f"is_{self.name}_array", None)
        if test is None:
            return type(x).__module__.split(".")[0] == self.package
        return bool(test(x))

    def is_namespace(self, xp: Any) -> bool:
        """Whether ``xp`` (a module or namespace object) is this backend's namespace."""
        if self.namespace_object is not None:
            return xp is self.namespace_object
        return bool(getattr(array_api_compat, f"is_{self.name}_namespace")(xp))


def _mod(name: str) -> Any:
    """A backend's module, imported when first used."""
    return importlib.import_module(name)


def install_extra(extra: str) -> str:
    """The command that installs one of this project's extras, from PyPI or a checkout."""
    return f"pip install 'microgpt-xp[{extra}]' (from a checkout: pip install '.[{extra}]')"


def _numpy_namespace() -> str:
    """NumPy itself from 2.1 on (array-api-compat's wrappers would add a Python call to
    every operation), else ``array_api_compat.numpy``."""
    major, minor = (int(part) for part in np.__version__.split(".")[:2])
    return "numpy" if (major, minor) >= (2, 1) else "array_api_compat.numpy"


def _cpu_only(name: str) -> Callable[[Any], Any]:
    def parse(device: Any) -> Any:
        if device not in (None, "cpu"):
            raise ArgumentValueError(
                "device", f"backend {name!r} has only the 'cpu' device, not {device!r}"
            )
        return "cpu"

    return parse


def _dask_attach_check(x: Any, check: Callable[[Any], bool], message: str) -> Any:
    def checked(block: Any) -> Any:
        if not check(block):
            raise ValueError(message)
        return block

    return _mod("dask.array").map_blocks(checked, x, dtype=x.dtype, meta=x._meta)


def _cupy_device(device: Any) -> Any:
    import cupy

    if isinstance(device, str):
        kind, _, index = device.partition(":")
        if kind not in ("cuda", "gpu") and not kind.isdigit():
            raise ArgumentValueError(
                "device", f"unknown cupy device {device!r}; use an int or 'cuda:N'"
            )
        device = int(kind) if kind.isdigit() else int(index or 0)
    if device is None or isinstance(device, int):
        return cupy.cuda.Device(device)
    return device


def _cupy_from_host(host: Any, device: Any, chunks: Any) -> Any:
    with device:
        return _mod("cupy").asarray(host)


def _strict_device(device: Any) -> Any:
    import array_api_strict

    if device is None or not isinstance(device, str):
        return array_api_strict.Device() if device is None else device
    try:
        return array_api_strict.Device(device)
    except ValueError as exc:
        raise ArgumentValueError(
            "device", f"unknown array_api_strict device {device!r}: {exc}"
        ) from exc


def _torch_device(device: Any) -> Any:
    import torch

    try:
        dev = torch.device("cpu") if device is None else torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ArgumentValueError("device", f"unknown torch device {device!r}: {exc}") from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ArgumentValueError(
            "device",
            f"torch device {device!r}: this torch has no usable CUDA (a CPU build, or no GPU "
            "here); use device 'cpu'",
        )
    return dev


def _jax_device(device: Any) -> Any:
    import jax

    if device is None:
        return jax.devices()[0]
    if not isinstance(device, str):
        return device
    platform, _, index = device.partition(":")
    try:
        return jax.devices(platform)[int(index or 0)]
    except (RuntimeError, ValueError, IndexError) as exc:
        raise ArgumentValueError("device", f"unknown jax device {device!r}: {exc}") from exc


def _jax_setup() -> None:
    import jax

    jax.config.update("jax_enable_x64", True)  # float64 needs it; float32 stays float32
    _pytree.register_pending()


def generic_backend(xp: Any) -> Backend:
    """The entry of an Array API namespace the table does not know (a module such as
    ``ndonnx``, or an object such as ``marray.masked_namespace(numpy)``): named by its
    ``__name__``; host data goes there by ``xp.asarray``; arrays come back through DLPack,
    else ``__array__`` (else ``TypeError``); devices are those of
    ``xp.__array_namespace_info__().devices()``, matched by their ``str``."""
    name = str(getattr(xp, "__name__", type(xp).__name__))

    def parse_device(device: Any) -> Any:
        if device is None:
            return None
        info = getattr(xp, "__array_namespace_info__", None)
        known = list(info().devices()) if info is not None else []
        for d in known:
            if device is d or device == d or str(device) == str(d):
                return d
        raise ArgumentValueError(
            "device",
            f"namespace {name!r} has no device {device!r} (its devices: "
            f"{', '.join(map(str, known)) or 'not listed'})",
        )

    def from_host(host: Any, device: Any, chunks: Any) -> Any:
        return xp.asarray(host) if device is None else xp.asarray(host, device=device)

    return Backend(
        name=name,
        namespace=name,
        install=f"install the package that provides {name!r}",
        parse_device=parse_device,
        from_host=from_host,
        to_host=_generic_to_host,
        package=name.split(".")[0],
        namespace_object=xp,
    )


def _generic_to_host(x: Any) -> Any:
    """A NumPy copy of an array of any library, through DLPack, else ``__array__``."""
    try:
        return np.from_dlpack(x)
    except (BufferError, TypeError, AttributeError, RuntimeError, ValueError):
        pass
    if hasattr(type(x), "__array__"):
        return np.asarray(x)
    raise TypeError(
        f"the values of {type(x).__module__}.{type(x).__name__} arrays cannot be copied to "
        "the host: the library offers neither DLPack nor __array__"
    )


#: Every backend, in the order users see them.
BACKENDS: dict[str, Backend] = {
    b.name: b
    for b in (
        Backend("numpy", _numpy_namespace(), "pip install numpy", _cpu_only("numpy")),
        Backend(
            "dask",
            "array_api_compat.dask.array",
            install_extra("dask"),
            _cpu_only("dask"),
            from_host=lambda h, d, c: _mod("dask.array").from_array(h, -1 if c is None else c),
            to_host=lambda x: np.asarray(x.compute()),
            lazy=True,
            persist=lambda arrays: list(_mod("dask").persist(*arrays)),
            attach_check=_dask_attach_check,
            chunk_meta=lambda x: x._meta,
        ),
        Backend(
            "cupy",
            "array_api_compat.cupy",
            "pip install cupy-cuda12x (or the wheel for your CUDA version; needs an NVIDIA GPU)",
            _cupy_device,
            from_host=_cupy_from_host,
            to_host=lambda x: np.asarray(x.get()),
            needs_gpu=True,
        ),
        Backend(
            "array_api_strict",
            "array_api_strict",
            install_extra("strict"),
            _strict_device,
            from_host=lambda h, d, c: _mod("array_api_strict").asarray(h, device=d),
            to_host=lambda x: np.asarray(x.to_device(_mod("array_api_strict").Device())),
        ),
        Backend(
            "torch",
            "array_api_compat.torch",
            "pip install torch --index-url https://download.pytorch.org/whl/cpu (the CPU "
            "build; a plain 'pip install torch' downloads the CUDA build, gigabytes)",
            _torch_device,
            from_host=lambda h, d, c: _mod("torch").from_numpy(np.ascontiguousarray(h)).to(d),
            to_host=lambda x: np.asarray(x.detach().cpu().numpy()),
        ),
        Backend(
            "jax",
            "jax.numpy",
            install_extra("jax"),
            _jax_device,
            from_host=lambda h, d, c: _mod("jax").device_put(h, d),
            setup=_jax_setup,
            compile=lambda fn: _mod("jax").jit(fn),
            is_traced=lambda x: isinstance(x, _mod("jax").core.Tracer),
        ),
    )
}
