"""JAX's overrides of :mod:`microgpt_xp.primitives`."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp


def scatter_add_rows(ids: Any, values: Any, num_rows: int) -> Any:
    """``.at[ids].add``: JAX's indexed add (a one-hot product would be rounded to the
    default matmul precision on GPUs and TPUs)."""
    out = jnp.zeros_like(values, shape=(num_rows, values.shape[-1]))
    return out.at[ids].add(values)
