"""``microgpt-xp export``: a checkpoint's weights as JSON in the original's state-dict
layout with its tokenizer (:func:`microgpt_xp.exact.export_state_dict`), or the model as
an ONNX graph (:func:`microgpt_xp.export_onnx`)."""

from __future__ import annotations

import argparse
import json

from . import _common as cli


def add_parser(sub: cli.Subcommands) -> None:
    """Add the ``export`` subcommand to ``sub``."""
    cli.add_command(
        sub,
        "export",
        "write a checkpoint's weights as JSON, or the model as an ONNX graph",
        "--format json: the weights in the original microgpt's state-dict names and layout,\n"
        'with the tokenizer ({"wte": [[...]], ..., "tokenizer": {"chars": ...}}).\n'
        "--format onnx: a standalone ONNX model of --graph, built by running the model's own\n"
        "code on ndonnx's lazy arrays (needs the [onnx] extra). Written atomically.",
        "checkpoint out format graph",
    ).set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Write the weights (or the graph) to ``--out``."""
    if args.format == "onnx" and args.out == "-":
        raise cli.UsageError("--format onnx writes a file: give --out FILE")
    if args.format != "onnx" and args.graph is not None:
        raise cli.UsageError("--graph applies only with --format onnx")
    cli.check_files(args, args.out)
    from .._files import atomic_write
    from ..checkpoint import load

    ck = load(args.checkpoint)
    if args.format == "onnx":
        from ..export import export_onnx

        graph = args.graph or "forward"
        export_onnx(ck.params, args.out, graph=graph, tokenizer=ck.tokenizer, mode=ck.mode)
        print(f"wrote the {graph} graph of {ck.config.num_params} weights to {args.out}")
        return 0
    from ..exact import export_state_dict
    from ..params import TOKENIZER_KEY

    state: dict[str, object] = dict(export_state_dict(ck.params))
    if ck.tokenizer is not None:
        state[TOKENIZER_KEY] = ck.tokenizer.to_dict()
    text = json.dumps(state)
    if args.out == "-":
        print(text)
    else:
        atomic_write(args.out, text + "\n")
        print(f"wrote {ck.config.num_params} weights to {args.out}")
    return 0
