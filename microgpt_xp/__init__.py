"""microgpt on the Python Array API: one GPT, its hand-written backward pass, Adam and
sampling, written once and run on NumPy, CuPy, Dask, PyTorch, JAX or array-api-strict."""

from ._version import __version__
from ._xp import BACKENDS
from .config import GPTConfig
from .model import KVCache, decode_step, forward, loss_and_grads, score
from .params import Params, init_params

__all__ = [
    "BACKENDS",
    "GPTConfig",
    "KVCache",
    "Params",
    "__version__",
    "decode_step",
    "forward",
    "init_params",
    "loss_and_grads",
    "score",
]
