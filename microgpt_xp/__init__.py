"""microgpt on the Python Array API: one GPT, its hand-written backward pass, Adam and
sampling, written once and run on NumPy, CuPy, Dask, PyTorch, JAX or array-api-strict.

The model code takes its namespace and device from its inputs; choose an array type
with ``backend=`` where arrays are created (``init_params``, ``train``) or by passing
arrays of that type.
"""

from ._version import __version__
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
from .train import ResumeError, TrainingError, TrainResult, train

__all__ = [
    "BACKENDS",
    "Adam",
    "AdamConfig",
    "AdamState",
    "Checkpoint",
    "CheckpointError",
    "DataError",
    "GPTConfig",
    "KVCache",
    "Params",
    "ResumeError",
    "Tokenizer",
    "TrainResult",
    "TrainingError",
    "__version__",
    "adam_init",
    "adam_update",
    "decode_step",
    "default_docs",
    "export_onnx",
    "forward",
    "init_params",
    "iter_samples",
    "load",
    "loss_and_grads",
    "read_docs",
    "run_exact",
    "sample",
    "sample_exact",
    "save",
    "score",
    "train",
    "train_step",
]
