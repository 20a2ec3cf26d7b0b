"""microgpt on the Python Array API: one GPT, its hand-written backward pass, Adam and sampling,
written once and run on NumPy, CuPy, Dask, PyTorch, JAX or array-api-strict (``backend=`` where
arrays are created, else the namespace and device of the arrays given)."""

from __future__ import annotations

import importlib
import sys
import types

from ._version import __version__

TYPE_CHECKING = False  # typing is not imported: the package loads in a few milliseconds
if TYPE_CHECKING:
    from typing import Any

    from ._xp import BACKENDS
    from .checkpoint import Checkpoint, CheckpointError, load, save
    from .config import GPTConfig
    from .data import DataError, Tokenizer, default_docs, read_docs
    from .exact import run_exact, sample_exact
    from .export import export_onnx
    from .model import KVCache, decode_step, forward, loss_and_grads, score, train_step
    from .optim import Adam, AdamConfig, AdamState, adam_init, adam_update
    from .params import Params, init_params
    from .sample import iter_samples, sample
    from .train import ResumeError, StepStats, TrainingError, TrainResult, train

#: Where each public name lives: loaded on first use (PEP 562), so that importing the
#: package (the command's start) is quick and Ctrl-C then is the command's own line.
_HOME = {
    name: module
    for module, names in {
        "_xp": "BACKENDS",
        "checkpoint": "Checkpoint CheckpointError load save",
        "config": "GPTConfig",
        "data": "DataError Tokenizer default_docs read_docs",
        "exact": "run_exact sample_exact",
        "export": "export_onnx",
        "model": "KVCache decode_step forward loss_and_grads score train_step",
        "optim": "Adam AdamConfig AdamState adam_init adam_update",
        "params": "Params init_params",
        "sample": "iter_samples sample",
        "train": "ResumeError StepStats TrainingError TrainResult train",
    }.items()
    for name in names.split()
}


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_HOME[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


class _Package(types.ModuleType):
    """The package, whose ``sample`` and ``train`` stay the functions when their modules load."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in ("sample", "train") and isinstance(value, types.ModuleType):
            value = getattr(value, name)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package

# fmt: off
__all__ = [
    "BACKENDS", "Adam", "AdamConfig", "AdamState", "Checkpoint", "CheckpointError", "DataError",
    "GPTConfig", "KVCache", "Params", "ResumeError", "StepStats", "Tokenizer", "TrainResult",
    "TrainingError", "__version__", "adam_init", "adam_update", "decode_step", "default_docs",
    "export_onnx", "forward", "init_params", "iter_samples", "load", "loss_and_grads",
    "read_docs", "run_exact", "sample", "sample_exact", "save", "score", "train", "train_step",
]
# fmt: on
