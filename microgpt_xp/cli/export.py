"""``microgpt-xp export``: a checkpoint's weights as JSON in the original's state-dict
layout (:func:`microgpt_xp.exact.export_state_dict`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ._common import Subcommands, add_checkpoint_option, add_command


def add_parser(sub: Subcommands) -> None:
    """Add the ``export`` subcommand to ``sub`` (the result of ``add_subparsers``)."""
    x = add_command(
        sub,
        "export",
        "write a checkpoint's weights as JSON in the original's state-dict layout",
        'Write the weights as JSON: {"wte": [[...]], ..., '
        '"layer0.mlp_fc2": [[...]]},\nthe original microgpt\'s state-dict names and '
        "matrix layout.",
    )
    add_checkpoint_option(x)
    x.add_argument("--out", metavar="FILE", required=True, help="JSON file to write ('-': stdout)")
    x.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Write the weights to ``--out`` (``-``: stdout)."""
    from ..checkpoint import load
    from ..exact import export_state_dict

    ck = load(args.checkpoint)
    text = json.dumps(export_state_dict(ck.params))
    if args.out == "-":
        print(text)
    else:
        Path(args.out).write_text(text + "\n", encoding="utf-8")
        print(f"wrote {ck.config.num_params} weights to {args.out}")
    return 0
