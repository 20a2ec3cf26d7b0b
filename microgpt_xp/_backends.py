"""The table of array backends: the one place that knows them by name. A namespace the table
does not know gets a generic entry (:func:`generic_backend`). Libraries are imported on use."""

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
    """One array library: ``name``, ``namespace`` module, ``install`` line, ``package``;
    ``parse_device``, ``from_host(numpy, device, chunks)``, ``to_host``; ``setup`` after import;
    ``compile``/``is_traced``; ``lazy``/``persist`` (Dask); chunked: ``attach_check(x, check, param,
    message)``, ``chunk_meta(x)`` (an empty chunk); ``namespace_object`` (generic entries)."""

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
    attach_check: Callable[[Any, Callable[[Any], bool], str, str], Any] | None = None
    chunk_meta: Callable[[Any], Any] | None = None
    namespace_object: Any = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "package", self.package or self.name)

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
        return type(x).__module__.split(".")[0] == self.package if test is None else test(x)

    def is_namespace(self, xp: Any) -> bool:
        """Whether ``xp`` (a module or namespace object) is this backend's namespace."""
        if self.namespace_object is not None:
            return xp is self.namespace_object
        return bool(getattr(array_api_compat, f"is_{self.name}_namespace")(xp))


_mod = importlib.import_module


def install_extra(extra: str) -> str:
    """The command that installs one of this project's extras, from PyPI or a checkout."""
    return f"pip install 'microgpt-xp[{extra}]' (from a checkout: pip install '.[{extra}]')"


def _bad_device(name: str, device: Any, why: Any) -> ArgumentValueError:
    return ArgumentValueError("device", f"unknown {name} device {device!r}: {why}")


def _cpu_only(name: str) -> Callable[[Any], Any]:
    def parse(device: Any) -> Any:
        if device not in (None, "cpu"):
            raise _bad_device(name, device, "it has only the 'cpu' device")
        return "cpu"

    return parse


def _dask_attach_check(x: Any, check: Callable[[Any], bool], param: str, message: str) -> Any:
    def checked(block: Any) -> Any:
        if not check(block):
            raise ArgumentValueError(param, message)
        return block

    return _mod("dask.array").map_blocks(checked, x, dtype=x.dtype, meta=x._meta)


def _cupy_device(device: Any) -> Any:
    if isinstance(device, str):
        kind, _, index = device.partition(":")
        if kind not in ("cuda", "gpu") and not kind.isdigit():
            raise _bad_device("cupy", device, "use an int or 'cuda:N'")
        device = int(kind) if kind.isdigit() else int(index or 0)
    return _mod("cupy").cuda.Device(device) if device is None or isinstance(device, int) else device


def _cupy_from_host(host: Any, device: Any, chunks: Any) -> Any:
    with device:
        return _mod("cupy").asarray(host)


def _strict_device(device: Any) -> Any:
    strict = _mod("array_api_strict")
    if device is None or not isinstance(device, str):
        return strict.Device() if device is None else device
    try:
        return strict.Device(device)
    except ValueError as exc:
        raise _bad_device("array_api_strict", device, exc) from exc


def _torch_device(device: Any) -> Any:
    torch = _mod("torch")
    try:
        dev = torch.device("cpu") if device is None else torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise _bad_device("torch", device, exc) from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        why = "this torch has no usable CUDA (a CPU build, or no GPU here); use device 'cpu'"
        raise _bad_device("torch", device, why)
    return dev


def _jax_device(device: Any) -> Any:
    jax = _mod("jax")
    if device is None or not isinstance(device, str):
        return jax.devices()[0] if device is None else device
    platform, _, index = device.partition(":")
    try:
        return jax.devices(platform)[int(index or 0)]
    except (RuntimeError, ValueError, IndexError) as exc:
        raise _bad_device("jax", device, exc) from exc


def _jax_setup() -> None:
    _mod("jax").config.update("jax_enable_x64", True)  # float64 needs it; float32 stays
    _pytree.register_pending()


def generic_backend(xp: Any) -> Backend:
    """The entry of a namespace outside the table, named by its ``__name__``: ``xp.asarray``
    in, DLPack (else ``__array__``) out; devices of ``__array_namespace_info__``, by ``str``."""
    name = str(getattr(xp, "__name__", type(xp).__name__))

    def parse_device(device: Any) -> Any:
        if device is None:
            return None
        info = getattr(xp, "__array_namespace_info__", None)
        known = list(info().devices()) if info is not None else []
        for d in known:
            if device is d or device == d or str(device) == str(d):
                return d
        raise _bad_device(name, device, f"its devices: {', '.join(map(str, known)) or '?'}")

    def from_host(host: Any, device: Any, chunks: Any) -> Any:
        return xp.asarray(host) if device is None else xp.asarray(host, device=device)

    install = f"install the package that provides {name!r}"
    return Backend(name, name, install, parse_device, from_host, _generic_to_host,
                   package=name.split(".")[0], namespace_object=xp)  # fmt: skip


def _generic_to_host(x: Any) -> Any:
    try:
        return np.from_dlpack(x)
    except (BufferError, TypeError, AttributeError, RuntimeError, ValueError):
        if hasattr(type(x), "__array__"):
            return np.asarray(x)
    raise TypeError(
        f"the values of {type(x).__module__}.{type(x).__name__} arrays cannot be copied to "
        "the host: the library offers neither DLPack nor __array__"
    )


_NUMPY_NS = "numpy" if tuple(map(int, np.__version__.split(".")[:2])) >= (2, 1) else "array_api_compat.numpy"  # fmt: skip
_TORCH = "pip install torch --index-url https://download.pytorch.org/whl/cpu (the CPU build)"

#: Every backend, in the order users see them.
BACKENDS: dict[str, Backend] = {
    b.name: b
    for b in (
        Backend("numpy", _NUMPY_NS, "pip install numpy", _cpu_only("numpy")),
        Backend(
            "dask", "array_api_compat.dask.array", install_extra("dask"), _cpu_only("dask"),
            from_host=lambda h, d, c: _mod("dask.array").from_array(h, -1 if c is None else c),
            to_host=lambda x: np.asarray(x.compute()),
            lazy=True,
            persist=lambda arrays: list(_mod("dask").persist(*arrays)),
            attach_check=_dask_attach_check,
            chunk_meta=lambda x: x._meta,
        ),
        Backend(
            "cupy", "array_api_compat.cupy", "pip install cupy-cuda12x (needs an NVIDIA GPU)",
            _cupy_device, _cupy_from_host, lambda x: np.asarray(x.get()), needs_gpu=True,
        ),
        Backend(
            "array_api_strict", "array_api_strict", install_extra("strict"), _strict_device,
            from_host=lambda h, d, c: _mod("array_api_strict").asarray(h, device=d),
            to_host=lambda x: np.asarray(x.to_device(_mod("array_api_strict").Device())),
        ),
        Backend(
            "torch", "array_api_compat.torch", _TORCH, _torch_device,
            from_host=lambda h, d, c: _mod("torch").from_numpy(np.ascontiguousarray(h)).to(d),
            to_host=lambda x: np.asarray(x.detach().cpu().numpy()),
        ),
        Backend(
            "jax", "jax.numpy", install_extra("jax"), _jax_device,
            from_host=lambda h, d, c: _mod("jax").device_put(h, d),
            setup=_jax_setup,
            compile=lambda fn: _mod("jax").jit(fn),
            is_traced=lambda x: isinstance(x, _mod("jax").core.Tracer),
        ),
    )
}  # fmt: skip
