"""The model's records (``Params``, ``AdamState``, ``KVCache``) as JAX pytrees.

microgpt_xp never imports JAX for this: a record is registered at once if JAX is loaded,
else when microgpt_xp next resolves a backend after JAX was imported (any ``backend=``,
``Params.to``, the JAX backend's set-up), through :func:`register_pending`.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

_lock = threading.Lock()
_pending: list[tuple[type, Callable[[Any], tuple[Sequence[Any], Any]], Callable[..., Any]]] = []


def register(
    cls: type,
    flatten: Callable[[Any], tuple[Sequence[Any], Any]],
    unflatten: Callable[[Any, Sequence[Any]], Any],
) -> None:
    """Make ``cls`` a JAX pytree: ``flatten(obj) -> (children, aux)`` (``aux`` hashable),
    ``unflatten(aux, children) -> obj`` (must not validate: JAX passes placeholders)."""
    _pending.append((cls, flatten, unflatten))
    register_pending()


def register_pending() -> None:
    """Register the records still waiting, if JAX has been imported."""
    if _pending and "jax" in sys.modules:
        from jax.tree_util import register_pytree_node

        with _lock:
            while _pending:
                register_pytree_node(*_pending.pop())
