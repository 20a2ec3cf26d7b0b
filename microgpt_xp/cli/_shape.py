"""The model-shape options of ``train`` and ``replay`` (``--n-layer``, ``--n-embd``,
``--n-head``, ``--block-size``) and the note on documents a block size cuts."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ._common import note, positive_int

if TYPE_CHECKING:
    from ..config import GPTConfig

#: The spec's model shape: the defaults of the shape options.
SPEC_SHAPE = {"n_layer": 1, "n_embd": 16, "n_head": 4, "block_size": 16}
#: The option of each shape field.
SHAPE_OPTIONS = {name: "--" + name.replace("_", "-") for name in SPEC_SHAPE}


def add_shape_options(p: argparse.ArgumentParser, block_default: str) -> None:
    """--n-layer, --n-embd, --n-head and --block-size, in a group of their own;
    ``block_default`` says what --block-size defaults to."""
    shape = p.add_argument_group(
        "model shape",
        "Stored in the checkpoint; sample, eval and export read it from there. With\n"
        "--resume, the checkpoint's shape is used (an option given must match it).",
    )
    helps = {
        "n_layer": "transformer blocks",
        "n_embd": "channels of the residual stream, a multiple of --n-head",
        "n_head": "attention heads",
    }
    for name, text in helps.items():
        shape.add_argument(
            SHAPE_OPTIONS[name],
            metavar="N",
            type=positive_int,
            default=None,
            help=f"{text} (default: {SPEC_SHAPE[name]})",
        )
    shape.add_argument(
        "--block-size",
        metavar="N",
        type=positive_int,
        default=None,
        help="positions the model reads: a document of up to N-1 characters is read "
        "whole; longer ones are cut to their first N characters, and a note says how "
        f"many {block_default}",
    )


def shape_text(config: GPTConfig) -> str:
    """`` (n_layer 2, ...)`` for a shape other than the spec's, else nothing (so that the
    default run prints what it always printed)."""
    shape = {name: getattr(config, name) for name in SPEC_SHAPE}
    if shape == SPEC_SHAPE:
        return ""
    return " (" + ", ".join(f"{name} {value}" for name, value in shape.items()) + ")"


def note_cut(docs: Sequence[str], block_size: int, what: str) -> None:
    """Say on stderr how many documents ``what`` (a block size of ``block_size``) cuts."""
    from ..data import block_size_for, count_cut

    cut = count_cut(docs, block_size)
    if cut:
        note(
            f"{cut} of {len(docs)} documents are longer than {what} reads whole "
            f"({block_size - 1} characters): training sees only their first {block_size} "
            f"characters, never their end (--block-size {block_size_for(docs)} fits the "
            "longest)"
        )
