"""The benchmark's peers: the same work as ours, done another way.

``scalar`` runs ``tests/reference.py``, the tests' independent pure-Python oracle (scalar
reverse-mode autograd on ``Value`` nodes, as the original microgpt): the original's speed
class. There is one scalar GPT in the repository, and it is that one.
"""

from __future__ import annotations

import copy
import importlib
import math
import random
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

#: ``tests/`` of this checkout, where the scalar oracle lives.
TESTS_DIR = Path(__file__).resolve().parents[2] / "tests"

#: Adam's schedule length for the timed steps: long enough that the linear decay of the
#: learning rate does not matter (ours uses the same).
NUM_STEPS = 2**62


def reference_module() -> ModuleType:
    """``tests/reference.py`` (imported as ``reference``, with ``tests/`` on ``sys.path``)."""
    if str(TESTS_DIR) not in sys.path:
        sys.path.insert(0, str(TESTS_DIR))
    return importlib.import_module("reference")


class _NeverDraws(random.Random):
    """A ``random.Random`` whose ``choices`` never draws ``stop`` (its weight is set to
    zero), so that ``reference.sample_one`` samples all ``block_size`` tokens, the work of
    our decode workload (which runs without early stop)."""

    def __init__(self, seed: int, stop: int) -> None:
        super().__init__(seed)
        self.stop = stop

    def choices(  # type: ignore[override]
        self, population: Sequence[Any], weights: Sequence[float], *, k: int = 1
    ) -> list[Any]:
        """``random.Random.choices`` with the weight of ``stop`` set to zero."""
        kept = [0.0 if i == self.stop else w for i, w in enumerate(weights)]
        return super().choices(population, kept, k=k)


class ScalarReference:
    """The scalar peer on one document: :mod:`reference`'s ``loss_and_grads`` and
    ``adam_step`` for a training step, ``gpt_logits`` and the mean NLL for scoring,
    ``sample_one`` for decoding, all on Python floats (float64).

    ``state_dict`` is the original's layout (``Params.to_state_dict()``, nested lists or
    host arrays); ``doc`` the ``T + 1`` token ids of the document; ``bos`` the id that
    starts a sample.
    """

    def __init__(
        self,
        state_dict: dict[str, Any],
        doc: Sequence[int],
        *,
        n_head: int,
        bos: int,
        temperature: float = 0.5,
        seed: int = 0,
    ) -> None:
        self.ref = reference_module()
        self.initial = {k: [[float(x) for x in row] for row in m] for k, m in state_dict.items()}
        self.state = copy.deepcopy(self.initial)
        self.m = self.ref.zeros_like(self.state)
        self.v = self.ref.zeros_like(self.state)
        self.step = 0
        self.doc = [int(t) for t in doc]
        self.n_head, self.bos, self.temperature = n_head, bos, temperature
        self.rng = _NeverDraws(seed, bos)

    def reset(self) -> None:
        """Back to the initial weights (the optimizer state is kept)."""
        self.state = copy.deepcopy(self.initial)

    def train_step(self) -> float:
        """Loss and gradients by scalar autograd, then one Adam update; returns the loss
        before the update."""
        loss, grads = self.ref.loss_and_grads(self.state, self.doc, n_head=self.n_head)
        self.ref.adam_step(self.state, grads, self.m, self.v, self.step, num_steps=NUM_STEPS)
        self.step += 1
        return float(loss)

    def score(self) -> float:
        """The document's mean NLL, forward only (``reference.gpt_logits`` on floats)."""
        logits = self.ref.gpt_logits(self.state, self.doc[:-1], n_head=self.n_head)
        nll = 0.0
        for z, target in zip(logits, self.doc[1:], strict=True):
            top = max(z)
            nll += math.log(sum(math.exp(zi - top) for zi in z)) + top - z[target]
        return nll / len(logits)

    def decode(self) -> list[int]:
        """``block_size`` tokens sampled from BOS through the KV cache at the temperature."""
        return list(
            self.ref.sample_one(
                self.state, self.rng, self.bos, temperature=self.temperature, n_head=self.n_head
            )
        )
