"""The table of array backends: the one place that knows them by name.

One :class:`Backend` entry per known array library says what it is called, which module
is its Array API namespace, what to install for it, how host (NumPy) data gets onto it
and back, how a user's device spec becomes a device object, and how its tests run. The
table lists what is *known*, not what is allowed: an Array API namespace it does not
know gets a generic entry (:func:`generic_backend`) built from the standard alone —
``xp.asarray`` onto the device, DLPack or ``__array__`` back to the host, devices from
``__array_namespace_info__`` — and runs the generic code. Everything else in
``microgpt_xp`` takes its namespace and device from its input arrays, and the helpers of
:mod:`microgpt_xp._xp` read this table; so do the noxfile and the test fixtures. Adding
a backend is one entry here, plus whatever truly differs in
:mod:`microgpt_xp.primitives`.

This module imports nothing but the standard library at import time (the noxfile loads it
by path, outside any environment that has NumPy); each backend's own modules are imported
inside its functions, when that backend is used.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Backend:
    """One array library.

    Attributes:
        name: what users pass as ``backend=`` and ``--backend``.
        namespace: the module that is the library's Array API namespace (or a function
            that names it, where that depends on the installed version).
        package: the top-level package whose presence means the backend is installed.
        install: what to run to install it (shown in errors; works from a checkout).
        test_extras: the extras of this project that its nox test session installs.
        test_device: the device its tests run on (``None``: the default device).
        needs_gpu: its arrays live on a GPU (its tests skip without one).
        parse_device: a user's device spec (``None`` for the default, a string, an int,
            or a device object) -> the library's device object.
        from_host: ``(numpy_array, device, chunks) -> array`` on the backend; ``chunks``
            is only used by chunked backends.
        to_host: an array of the backend -> a NumPy array (computing a lazy one).
        is_array: whether an object is an array of this backend.
        is_namespace: whether a namespace (module or object) is this backend's, e.g.
            ``numpy`` or ``array_api_compat.numpy`` for NumPy.
        test_install: packages the nox session installs before the project (a pinned CPU
            build, where a plain install would pull a GPU build).
        setup: called once, right after the namespace is first imported.
        lazy: its arrays are computed only when asked (Dask): values are not known
            without a compute.
        is_traced: for backends with a tracing compiler, whether an array is a tracer
            (its values unknown until the compiled function runs); ``None`` elsewhere.
        compile: the backend's compiler, ``fn -> compiled fn`` for pure functions of
            arrays and records (``jax.jit``); ``None`` where there is none worth using.
        attach_check: for chunked lazy backends, ``(x, check, message) -> x`` with
            ``check(block)`` run on every block when computed (``ValueError(message)``
            if it returns False); ``None`` elsewhere.
        persist: for lazy backends, evaluates a list of arrays in one computation and
            returns them as arrays held in memory (``None`` for eager backends).
        chunk_meta: for chunked backends (Dask), ``x -> an empty array of x's chunk
            type``; such a backend given to a driver as ``backend=`` means one task per
            chunk of a batch (:class:`microgpt_xp.runners.dask.DaskTasks`), the weights
            and chunks living on the chunks' backend (NumPy when created from the host).
    """

    name: str
    namespace: str | Callable[[], str]
    package: str
    install: str
    test_extras: str
    parse_device: Callable[[Any], Any]
    from_host: Callable[[Any, Any, Any], Any]
    to_host: Callable[[Any], Any]
    is_array: Callable[[Any], bool]
    is_namespace: Callable[[Any], bool] = lambda xp: False
    test_device: str | None = None
    needs_gpu: bool = False
    test_install: tuple[str, ...] = ()
    setup: Callable[[], None] | None = None
    persist: Callable[[list[Any]], list[Any]] | None = None
    attach_check: Callable[[Any, Callable[[Any], bool], str], Any] | None = None
    compile: Callable[[Callable[..., Any]], Callable[..., Any]] | None = None
    lazy: bool = False
    chunk_meta: Callable[[Any], Any] | None = None
    is_traced: Callable[[Any], bool] | None = None

    #: the namespace object itself, for generic entries (:func:`generic_backend`)
    namespace_object: Any = None

    @property
    def chunked(self) -> bool:
        """Whether its arrays are chunks of another backend's arrays (Dask)."""
        return self.chunk_meta is not None

    def namespace_module(self) -> str:
        """The name of the namespace module."""
        if self.namespace_object is not None:
            return str(getattr(self.namespace_object, "__name__", self.name))
        return self.namespace if isinstance(self.namespace, str) else self.namespace()


def _np() -> Any:
    return importlib.import_module("numpy")


def _numpy_namespace() -> str:
    """NumPy itself from 2.1 on (it implements the standard; array-api-compat's wrappers
    would add a Python call to every operation, a tenth of a small model's training
    step), else ``array_api_compat.numpy``."""
    major, minor = (int(part) for part in _np().__version__.split(".")[:2])
    return "numpy" if (major, minor) >= (2, 1) else "array_api_compat.numpy"


def _cpu_only(name: str) -> Callable[[Any], Any]:
    def parse(device: Any) -> Any:
        if device not in (None, "cpu"):
            raise ValueError(f"backend {name!r} has only the 'cpu' device, not {device!r}")
        return "cpu"

    return parse


def _is_numpy(x: Any) -> bool:
    np = _np()
    return isinstance(x, (np.ndarray, np.generic))


# -- dask ----------------------------------------------------------------------------------
def _dask_from_host(host: Any, device: Any, chunks: Any) -> Any:
    import dask.array as da

    return da.from_array(host, chunks=-1 if chunks is None else chunks)


def _dask_persist(arrays: list[Any]) -> list[Any]:
    from dask.base import persist

    return list(persist(*arrays))


def _dask_attach_check(x: Any, check: Callable[[Any], bool], message: str) -> Any:
    import dask.array as da

    def checked(block: Any) -> Any:
        if not check(block):
            raise ValueError(message)
        return block

    return da.map_blocks(checked, x, dtype=x.dtype, meta=x._meta)


def _dask_to_host(x: Any) -> Any:
    return _np().asarray(x.compute())


def _is_dask(x: Any) -> bool:
    import array_api_compat

    return bool(array_api_compat.is_dask_array(x))


# -- cupy ----------------------------------------------------------------------------------
def _cupy_device(device: Any) -> Any:
    import cupy

    if device is None:
        return cupy.cuda.Device()
    if isinstance(device, str):
        kind, _, index = device.partition(":")
        if kind not in ("cuda", "gpu") and not kind.isdigit():
            raise ValueError(f"unknown cupy device {device!r}; use an int or 'cuda:N'")
        device = int(index or 0) if not kind.isdigit() else int(kind)
    return cupy.cuda.Device(device) if isinstance(device, int) else device


def _cupy_from_host(host: Any, device: Any, chunks: Any) -> Any:
    import cupy

    with device:
        return cupy.asarray(host)


def _is_cupy(x: Any) -> bool:
    import array_api_compat

    return bool(array_api_compat.is_cupy_array(x))


# -- array-api-strict ----------------------------------------------------------------------
def _strict_device(device: Any) -> Any:
    import array_api_strict

    if device is None:
        return array_api_strict.Device()
    if isinstance(device, str):
        try:
            return array_api_strict.Device(device)
        except ValueError as exc:
            raise ValueError(f"unknown array_api_strict device {device!r}: {exc}") from exc
    return device


def _strict_from_host(host: Any, device: Any, chunks: Any) -> Any:
    import array_api_strict

    return array_api_strict.asarray(host, device=device)


def _strict_to_host(x: Any) -> Any:
    import array_api_strict

    return _np().asarray(x.to_device(array_api_strict.Device("CPU_DEVICE")))


def _is_strict(x: Any) -> bool:
    return type(x).__module__.startswith("array_api_strict")


# -- torch ---------------------------------------------------------------------------------
def _torch_device(device: Any) -> Any:
    import torch

    try:
        dev = torch.device("cpu") if device is None else torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"unknown torch device {device!r}: {exc}") from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"torch device {device!r}: this torch has no usable CUDA (a CPU build, or no GPU "
            "here); use device 'cpu'"
        )
    return dev


def _torch_from_host(host: Any, device: Any, chunks: Any) -> Any:
    import torch

    return torch.from_numpy(_np().ascontiguousarray(host)).to(device)


def _torch_to_host(x: Any) -> Any:
    return _np().asarray(x.detach().cpu().numpy())


def _is_torch(x: Any) -> bool:
    import array_api_compat

    return bool(array_api_compat.is_torch_array(x))


# -- jax -----------------------------------------------------------------------------------
def _jax_device(device: Any) -> Any:
    import jax

    if device is None:
        return jax.devices()[0]
    if isinstance(device, str):
        platform, _, index = device.partition(":")
        try:
            return jax.devices(platform)[int(index or 0)]
        except (RuntimeError, ValueError, IndexError) as exc:
            raise ValueError(f"unknown jax device {device!r}: {exc}") from exc
    return device


def _jax_setup() -> None:
    import jax

    # float64 needs x64 mode; enabling it keeps float32 arrays float32
    jax.config.update("jax_enable_x64", True)


def _jax_from_host(host: Any, device: Any, chunks: Any) -> Any:
    import jax

    return jax.device_put(host, device)


def _jax_compile(fn: Callable[..., Any]) -> Callable[..., Any]:
    import jax

    return jax.jit(fn)  # type: ignore[no-any-return]


def _jax_is_traced(x: Any) -> bool:
    import jax

    return isinstance(x, jax.core.Tracer)


def _is_jax(x: Any) -> bool:
    import array_api_compat

    return bool(array_api_compat.is_jax_array(x))


def _compat(test: str, xp: Any) -> bool:
    """``array_api_compat.<test>(xp)``: does the namespace ``xp`` belong to a library."""
    import array_api_compat

    return bool(getattr(array_api_compat, test)(xp))


# -- a namespace the table does not know ----------------------------------------------------
def generic_backend(xp: Any) -> Backend:
    """The entry of an Array API namespace the table does not know (a module such as
    ``ndonnx``, or a namespace object such as ``marray.masked_namespace(numpy)``), built
    from the standard alone: its name is the namespace's ``__name__``; host data goes
    there with ``xp.asarray`` (on ``device=`` where given); arrays come back through
    DLPack, else ``__array__``, else not at all (``TypeError``); devices are those of
    ``xp.__array_namespace_info__().devices()``, named by their ``str``."""
    name = str(getattr(xp, "__name__", type(xp).__name__))

    def parse_device(device: Any) -> Any:
        if device is None:
            return None
        info = getattr(xp, "__array_namespace_info__", None)
        known = list(info().devices()) if info is not None else []
        for d in known:
            if device is d or device == d or str(device) == str(d):
                return d
        raise ValueError(
            f"namespace {name!r} has no device {device!r} (its devices: "
            f"{', '.join(map(str, known)) or 'not listed'})"
        )

    def from_host(host: Any, device: Any, chunks: Any) -> Any:
        return xp.asarray(host) if device is None else xp.asarray(host, device=device)

    def is_array(x: Any) -> bool:
        import array_api_compat

        try:
            return array_api_compat.array_namespace(x) is xp
        except TypeError:
            return False

    return Backend(
        name=name,
        namespace=name,
        package=name.split(".")[0],
        install=f"install the package that provides {name!r}",
        test_extras="test",
        parse_device=parse_device,
        from_host=from_host,
        to_host=_generic_to_host,
        is_array=is_array,
        is_namespace=lambda other: other is xp,
        namespace_object=xp,
    )


def _generic_to_host(x: Any) -> Any:
    """A NumPy copy of an array of any library, through DLPack, else ``__array__``."""
    np = _np()
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


def install_extra(extra: str) -> str:
    """The command that installs one of this project's extras, from PyPI or a checkout."""
    return f"pip install 'microgpt-xp[{extra}]' (from a checkout: pip install '.[{extra}]')"


#: Every backend, in the order users see them.
BACKENDS: dict[str, Backend] = {
    b.name: b
    for b in (
        Backend(
            name="numpy",
            namespace=_numpy_namespace,
            package="numpy",
            install="pip install numpy",
            test_extras="test,dask,plot",
            parse_device=_cpu_only("numpy"),
            from_host=lambda host, device, chunks: host,
            to_host=lambda x: _np().asarray(x),
            is_array=_is_numpy,
            is_namespace=lambda xp: _compat("is_numpy_namespace", xp),
        ),
        Backend(
            name="dask",
            namespace="array_api_compat.dask.array",
            package="dask",
            install=install_extra("dask"),
            test_extras="test,dask",
            parse_device=_cpu_only("dask"),
            from_host=_dask_from_host,
            to_host=_dask_to_host,
            is_array=_is_dask,
            is_namespace=lambda xp: _compat("is_dask_namespace", xp),
            persist=_dask_persist,
            attach_check=_dask_attach_check,
            lazy=True,
            chunk_meta=lambda x: x._meta,
        ),
        Backend(
            name="cupy",
            namespace="array_api_compat.cupy",
            package="cupy",
            install="pip install cupy-cuda12x (or the wheel for your CUDA version; needs an "
            "NVIDIA GPU)",
            test_extras="test,cupy",
            parse_device=_cupy_device,
            from_host=_cupy_from_host,
            to_host=lambda x: _np().asarray(x.get()),
            is_array=_is_cupy,
            is_namespace=lambda xp: _compat("is_cupy_namespace", xp),
            needs_gpu=True,
        ),
        Backend(
            name="array_api_strict",
            namespace="array_api_strict",
            package="array_api_strict",
            install=install_extra("strict"),
            test_extras="test,strict",
            parse_device=_strict_device,
            from_host=_strict_from_host,
            to_host=_strict_to_host,
            is_array=_is_strict,
            is_namespace=lambda xp: _compat("is_array_api_strict_namespace", xp),
            test_device="device1",
        ),
        Backend(
            name="torch",
            namespace="array_api_compat.torch",
            package="torch",
            install="pip install torch --index-url https://download.pytorch.org/whl/cpu "
            "(the CPU build; a plain 'pip install torch' downloads the CUDA build, gigabytes)",
            test_extras="test",
            parse_device=_torch_device,
            from_host=_torch_from_host,
            to_host=_torch_to_host,
            is_array=_is_torch,
            is_namespace=lambda xp: _compat("is_torch_namespace", xp),
            test_install=("torch==2.13.0",),
        ),
        Backend(
            name="jax",
            namespace="jax.numpy",
            package="jax",
            install=install_extra("jax"),
            test_extras="test,jax",
            parse_device=_jax_device,
            from_host=_jax_from_host,
            to_host=lambda x: _np().asarray(x),
            is_array=_is_jax,
            is_namespace=lambda xp: _compat("is_jax_namespace", xp),
            setup=_jax_setup,
            compile=_jax_compile,
            is_traced=_jax_is_traced,
        ),
    )
}
