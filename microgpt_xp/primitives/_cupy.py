"""CuPy's overrides: only its indexed add (no GPU was at hand to measure fused kernels)."""

from __future__ import annotations

from typing import Any

import cupy
import cupyx


def scatter_add_rows(ids: Any, values: Any, num_rows: int) -> Any:
    """``cupyx.scatter_add`` (a one-hot product could be rounded to TF32)."""
    with values.device:
        out = cupy.zeros((num_rows, values.shape[-1]), dtype=values.dtype)
    cupyx.scatter_add(out, ids, values)
    return out
