"""The model's records (``Params``, ``AdamState``, ``KVCache``) as JAX pytrees.

A record registered here becomes a pytree as soon as JAX is imported, whichever of JAX
and microgpt_xp is imported first, without microgpt_xp importing JAX itself (it is an
optional dependency and slow to import): if JAX is already loaded the registration is
immediate, otherwise an import hook performs it right after ``import jax`` finishes.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

_lock = threading.Lock()
_pending: list[tuple[type, Callable[[Any], tuple[Sequence[Any], Any]], Callable[..., Any]]] = []
_done: set[type] = set()


def register(
    cls: type,
    flatten: Callable[[Any], tuple[Sequence[Any], Any]],
    unflatten: Callable[[Any, Sequence[Any]], Any],
) -> None:
    """Make ``cls`` a JAX pytree: ``flatten(obj) -> (children, aux)`` (children are the
    arrays or sub-records, ``aux`` hashable static data), ``unflatten(aux, children) ->
    obj`` (must not validate: JAX passes placeholders as children)."""
    with _lock:
        _pending.append((cls, flatten, unflatten))
    if "jax.tree_util" in sys.modules:
        _register_pending()
    else:
        _install_hook()


def _register_pending() -> None:
    import jax

    with _lock:
        for cls, flatten, unflatten in _pending:
            if cls not in _done:
                jax.tree_util.register_pytree_node(cls, flatten, unflatten)
                _done.add(cls)
        _pending.clear()


class _AfterJaxImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself; wraps the loader of the top-level ``jax`` package so that the
    pending registrations run once ``jax`` has been executed."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "jax":
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        original = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            original(module)
            _remove_hook()
            _register_pending()

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


_hook: _AfterJaxImport | None = None


def _install_hook() -> None:
    global _hook
    with _lock:
        if _hook is None:
            _hook = _AfterJaxImport()
            sys.meta_path.insert(0, _hook)


def _remove_hook() -> None:
    global _hook
    with _lock:
        if _hook is not None and _hook in sys.meta_path:
            sys.meta_path.remove(_hook)
        _hook = None
