"""A CuPy stand-in on the CPU for tests of Dask arrays whose chunks are not NumPy's: an
array type that wraps a NumPy array, implements the NumPy protocols (``__array_ufunc__``,
``__array_function__`` and every ndarray method) and, like CuPy, refuses to mix with
NumPy arrays (``TypeError: Unsupported type``). A graph piece created on the host (a
NumPy chunk) therefore fails where it meets the data, or shows as a NumPy result."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.lib.mixins


def _unwrap(x: Any) -> Any:
    if isinstance(x, FakeGPU):
        return x._a
    if isinstance(x, np.ndarray) and x.ndim > 0:
        raise TypeError(f"Unsupported type {type(x)}")
    if isinstance(x, (list, tuple)):
        return type(x)(_unwrap(v) for v in x)
    return x


def _wrap(x: Any) -> Any:
    if isinstance(x, np.ndarray):
        return FakeGPU(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_wrap(v) for v in x)
    return x


class FakeGPU(numpy.lib.mixins.NDArrayOperatorsMixin):
    """A NumPy array \"on the device\": no implicit conversion to or mixing with NumPy."""

    def __init__(self, a):
        self._a = np.asarray(a)

    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    nbytes = property(lambda self: self._a.nbytes)
    T = property(lambda self: FakeGPU(self._a.T))

    def __len__(self):
        return len(self._a)

    def __repr__(self):
        return f"FakeGPU({self._a!r})"

    def __getitem__(self, key):
        return _wrap(self._a[_unwrap(key)])

    def __setitem__(self, key, value):
        self._a[_unwrap(key)] = _unwrap(value)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        out = getattr(ufunc, method)(*_unwrap(inputs), **{k: _unwrap(v) for k, v in kwargs.items()})
        return _wrap(out)

    def __array_function__(self, func, types, args, kwargs):
        return _wrap(func(*_unwrap(args), **{k: _unwrap(v) for k, v in kwargs.items()}))

    def get(self):
        return self._a

    def __getattr__(self, name):
        # every other ndarray method, its array results kept on the "device"
        attr = getattr(self._a, name)
        if not callable(attr):
            return _wrap(attr)
        return lambda *a, **k: _wrap(attr(*_unwrap(a), **{n: _unwrap(v) for n, v in k.items()}))
