"""The one module that knows array backends by name.

Everything else in microgpt_xp takes its namespace and device from its input arrays
(``array_api_compat.array_namespace`` and ``device``). This module turns the names a
user types (``"numpy"``, ``"dask"``, ``"cupy"``, ``"array_api_strict"``, ``"torch"``,
``"jax"``) into a namespace and a device, moves host (NumPy) data onto a backend and
back, and answers the few questions that cannot be asked through the standard
(is this array lazy, which backend is it).
"""

from __future__ import annotations

import functools
import importlib
from typing import Any

import array_api_compat
import numpy as np

#: Backend names accepted by ``backend=`` arguments and the ``--backend`` option.
BACKENDS: tuple[str, ...] = ("numpy", "dask", "cupy", "array_api_strict", "torch", "jax")

#: The floating dtypes the model supports.
DTYPES: tuple[str, ...] = ("float32", "float64")

_INSTALL_HINT = {
    "numpy": "numpy",
    "dask": "microgpt-xp[dask]",
    "cupy": "microgpt-xp[cupy]",
    "array_api_strict": "microgpt-xp[strict]",
    "torch": "microgpt-xp[torch]",
    "jax": "microgpt-xp[jax]",
}


def check_backend(backend: str) -> str:
    """Return ``backend`` if it is a known backend name, else raise ``ValueError``."""
    if not isinstance(backend, str) or backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    return backend


def check_dtype(dtype: str) -> str:
    """Return ``dtype`` if it is a supported floating dtype name, else raise ``ValueError``."""
    if dtype not in DTYPES:
        raise ValueError(f"unsupported dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    return dtype


def namespace(backend: str) -> Any:
    """The Array API namespace for a backend name (imported on first use).

    Raises ``ValueError`` for an unknown name and ``ImportError`` (with the extra to
    install) when the backend's package is missing.
    """
    check_backend(backend)
    if backend == "numpy":
        return _numpy_namespace()
    module = {
        "dask": "array_api_compat.dask.array",
        "cupy": "array_api_compat.cupy",
        "array_api_strict": "array_api_strict",
        "torch": "array_api_compat.torch",
        "jax": "jax.numpy",
    }[backend]
    try:
        if backend == "jax":
            import jax

            # float64 needs x64 mode; enabling it keeps float32 arrays float32.
            jax.config.update("jax_enable_x64", True)
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"backend {backend!r} is not installed: pip install '{_INSTALL_HINT[backend]}' ({exc})"
        ) from exc


def _numpy_namespace() -> Any:
    """NumPy itself from 2.1 on (it implements the standard; array-api-compat's wrappers
    would add a Python call to every operation, a tenth of a small model's training
    step), else ``array_api_compat.numpy``."""
    major, minor = (int(part) for part in np.__version__.split(".")[:2])
    if (major, minor) >= (2, 1):
        return np
    return importlib.import_module("array_api_compat.numpy")


def resolve_device(backend: str, device: Any = None) -> Any:
    """Turn a user's device (``None``, a string such as ``"cpu"``/``"cuda:0"``/``"device1"``,
    an int GPU index, or a backend device object) into the backend's device object.

    ``None`` means the backend's default device.
    """
    xp = namespace(backend)
    if backend == "numpy" or backend == "dask":
        if device not in (None, "cpu"):
            raise ValueError(f"backend {backend!r} has only the 'cpu' device, not {device!r}")
        return "cpu"
    if backend == "array_api_strict":
        if device is None:
            return xp.Device()
        if isinstance(device, str):
            try:
                return xp.Device(device)
            except ValueError as exc:
                raise ValueError(f"unknown array_api_strict device {device!r}: {exc}") from exc
        return device
    if backend == "torch":
        import torch

        try:
            return torch.device("cpu") if device is None else torch.device(device)
        except (RuntimeError, TypeError) as exc:
            raise ValueError(f"unknown torch device {device!r}: {exc}") from exc
    if backend == "cupy":
        import cupy

        if device is None:
            return cupy.cuda.Device()
        if isinstance(device, str):
            device = int(device.split(":")[-1]) if ":" in device else 0
        return cupy.cuda.Device(device) if isinstance(device, int) else device
    # jax
    import jax

    if device is None:
        return jax.devices()[0]
    if isinstance(device, str):
        platform, _, index = device.partition(":")
        try:
            return jax.devices(platform)[int(index or 0)]
        except RuntimeError as exc:
            raise ValueError(f"unknown jax device {device!r}: {exc}") from exc
    return device


def torch_device_like(backend: str, device: Any = None) -> str:
    """The PyTorch device string of the hardware that ``backend``/``device`` computes on:
    ``"cuda:N"`` for CuPy GPU ``N`` (and JAX's ``gpu:N``), the device itself for torch,
    ``"cpu"`` for the host backends. Used to put a PyTorch peer next to our arrays."""
    dev = resolve_device(backend, device)
    if backend == "cupy":
        return f"cuda:{dev.id}"
    if backend == "torch":
        return str(dev)
    if backend == "jax" and dev.platform == "gpu":
        return f"cuda:{dev.id}"
    return "cpu"


def device_name(backend: str, device: Any = None) -> str:
    """A readable name of the processor behind ``backend``/``device``: the GPU's name
    for CuPy and CUDA devices of torch, else ``"cpu"`` (or the device's own string)."""
    dev = resolve_device(backend, device)
    if backend == "cupy":
        import cupy

        name = cupy.cuda.runtime.getDeviceProperties(dev.id)["name"]
        return str(name.decode() if isinstance(name, bytes) else name)
    if backend == "torch" and dev.type == "cuda":
        import torch

        return str(torch.cuda.get_device_name(dev))
    if backend == "jax":
        return str(getattr(dev, "device_kind", dev))
    return "cpu" if backend in ("numpy", "dask") else str(dev)


def asarray(
    host: Any, backend: str, *, device: Any = None, dtype: str | None = None, chunks: Any = None
) -> Any:
    """Move host data (nested lists or a NumPy array) onto ``backend``/``device``.

    ``dtype`` is a dtype name (``"float32"``, ``"int64"``, ...); ``None`` keeps the
    host dtype. On Dask, ``chunks`` sets the chunking (default: one chunk).
    """
    host = np.asarray(host) if dtype is None else np.asarray(host, dtype=dtype)
    if backend == "dask":
        import dask.array as da

        return da.from_array(host, chunks=-1 if chunks is None else chunks)
    xp = namespace(backend)
    dev = resolve_device(backend, device)
    if backend == "numpy":
        return xp.asarray(host)
    if backend == "cupy":
        import cupy

        with dev:
            return cupy.asarray(host)
    if backend == "jax":
        import jax

        return jax.device_put(host, dev)
    if backend == "torch":
        import torch

        return torch.from_numpy(np.ascontiguousarray(host)).to(dev)
    return xp.asarray(host, device=dev)


def backend_of(x: Any) -> str:
    """The backend name of an array (``"numpy"``, ``"dask"``, ...)."""
    if isinstance(x, np.ndarray):
        # first: a freshly started Dask worker may still be importing dask.array, and
        # is_dask_array would then fail on the half-imported module
        return "numpy"
    checks = (
        ("dask", array_api_compat.is_dask_array),
        ("cupy", array_api_compat.is_cupy_array),
        ("torch", array_api_compat.is_torch_array),
        ("jax", array_api_compat.is_jax_array),
        ("array_api_strict", lambda a: type(a).__module__.startswith("array_api_strict")),
        ("numpy", array_api_compat.is_numpy_array),
    )
    for name, check in checks:
        if check(x):
            return name
    raise TypeError(f"not an array of a supported backend: {type(x).__name__}")


def to_numpy(x: Any) -> np.ndarray:
    """Copy any supported array (computing it if lazy) to a NumPy array on the host."""
    backend = backend_of(x)
    if backend == "dask":
        return np.asarray(x.compute())
    if backend == "cupy":
        return np.asarray(x.get())
    if backend == "torch":
        return np.asarray(x.detach().cpu().numpy())
    if backend == "array_api_strict":
        import array_api_strict

        return np.asarray(x.to_device(array_api_strict.Device("CPU_DEVICE")))
    return np.asarray(x)


def runs_on_host_threads(x: Any) -> bool:
    """True for arrays whose operations run in the calling thread on this host's CPU and
    release the GIL while they compute (NumPy), so that threads over shards of a batch
    run in parallel. Other backends bring their own parallelism (torch's intra-op
    threads, GPUs, Dask's scheduler) or none that threads could use."""
    return isinstance(x, np.ndarray)


def is_lazy(x: Any) -> bool:
    """True for arrays whose values are not known without a compute (Dask, traced JAX)."""
    if array_api_compat.is_jax_array(x):
        # array-api-compat calls every JAX array lazy; only tracers (under jit) are
        import jax

        return isinstance(x, jax.core.Tracer)
    return bool(array_api_compat.is_lazy_array(x))


def lazy_value_check(x: Any, check: Any, message: str) -> Any:
    """Attach a value check to a lazy Dask array so that it raises ``ValueError(message)``
    when the data is computed; other lazy arrays are returned unchanged.

    ``check`` takes a NumPy block and returns True when the block is valid.
    """
    if not array_api_compat.is_dask_array(x):
        return x

    def _checked(block: Any) -> Any:
        if not check(block):
            raise ValueError(message)
        return block

    import dask.array as da

    return da.map_blocks(_checked, x, dtype=x.dtype)


def materialize(arrays: list[Any]) -> list[Any]:
    """Evaluate lazy Dask arrays in one computation and keep them as in-memory Dask arrays
    (``dask.persist``), so that a training loop's graph does not grow step after step.
    Arrays of other backends are returned as they are."""
    if not any(array_api_compat.is_dask_array(a) for a in arrays):
        return arrays
    from dask.base import persist

    return list(persist(*arrays))


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
            ns = _numpy_namespace()
        else:
            ns = array_api_compat.array_namespace(arrays[0])
        _NAMESPACES[kind] = ns
    return ns
