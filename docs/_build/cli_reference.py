"""MkDocs hook: the command-line reference, generated from the real parser at build time.

A page that contains the marker ``<!-- microgpt-xp-cli-reference -->`` gets it replaced by
one section per command and subcommand of :func:`microgpt_xp.cli.build_parser`: the
summary, a table of the arguments and the ``--help`` text exactly as the command prints
it. The parser is walked generically (every sub-parser of every ``add_subparsers``), so
the page follows the CLI as it changes, with no list of options kept here.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError

MARKER = "<!-- microgpt-xp-cli-reference -->"
#: Help is wrapped at this width, whatever the terminal of the build.
WIDTH = "88"


@contextlib.contextmanager
def _plain_terminal() -> Iterator[None]:
    """A fixed width and no colours (Python 3.14's argparse colours help on a tty)."""
    saved = {k: os.environ.get(k) for k in ("COLUMNS", "NO_COLOR", "PYTHON_COLORS")}
    os.environ.update(COLUMNS=WIDTH, NO_COLOR="1", PYTHON_COLORS="0")
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _build_parser(root: Path) -> argparse.ArgumentParser:
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    # `mkdocs serve` rebuilds after edits: import the CLI package and its subcommand
    # modules afresh (a reload of the package alone would keep the old subcommands)
    for name in [
        n for n in sys.modules if n == "microgpt_xp.cli" or n.startswith("microgpt_xp.cli.")
    ]:
        del sys.modules[name]
    try:
        parser = importlib.import_module("microgpt_xp.cli").build_parser()
    except Exception as exc:
        raise PluginError(f"cannot build the CLI parser for the reference: {exc!r}") from exc
    if not isinstance(parser, argparse.ArgumentParser):
        raise PluginError(f"build_parser() returned {type(parser).__name__}, not an ArgumentParser")
    return parser


def _subcommands(
    parser: argparse.ArgumentParser,
) -> Iterator[tuple[str, str | None, argparse.ArgumentParser]]:
    """``(name, one-line help, parser)`` of each direct subcommand, in definition order."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            seen: set[int] = set()
            for name, sub in action.choices.items():
                if id(sub) in seen:  # aliases map to the same parser
                    continue
                seen.add(id(sub))
                yield name, helps.get(name), sub


def _expand(action: argparse.Action, prog: str) -> str:
    """The action's help with ``%(default)s`` and friends filled in, as argparse does."""
    text = action.help or ""
    if "%" not in text:
        return text
    params: dict[str, Any] = dict(vars(action), prog=prog)
    params = {k: v for k, v in params.items() if v is not argparse.SUPPRESS}
    for k, v in list(params.items()):
        if hasattr(v, "__name__"):
            params[k] = v.__name__
    if isinstance(params.get("choices"), (list, tuple, dict, set, range)):
        params["choices"] = ", ".join(map(str, params["choices"]))
    try:
        return text % params
    except (KeyError, TypeError, ValueError):
        return text


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ").strip()


def _argument_table(parser: argparse.ArgumentParser) -> str:
    rows = []
    for action in parser._actions:
        if action.help is argparse.SUPPRESS or isinstance(
            action, (argparse._SubParsersAction, argparse._HelpAction)
        ):
            continue
        if action.option_strings:
            name = ", ".join(f"`{s}`" for s in action.option_strings)
            if action.nargs != 0 and (action.metavar or action.choices is None):
                metavar = action.metavar or action.dest.upper()
                name += f" `{_cell(metavar)}`" if isinstance(metavar, str) else ""
        else:
            name = f"`{action.metavar or action.dest}`"
        choices = action.choices if action.choices is not None else ()
        values = ", ".join(f"`{c}`" for c in choices)
        default = action.default
        if action.required:
            shown = "required"
        elif default in (None, argparse.SUPPRESS) or action.nargs == 0:
            shown = ""
        else:
            shown = f"`{_cell(default)}`"

        rows.append(f"| {name} | {_cell(_expand(action, parser.prog))} | {values} | {shown} |")
    if not rows:
        return ""
    head = "| argument | meaning | choices | default |\n|---|---|---|---|\n"
    return head + "\n".join(rows) + "\n"


def _section(
    parser: argparse.ArgumentParser, path: list[str], summary: str | None, level: int
) -> list[str]:
    _no_colour(parser)
    with _plain_terminal():
        help_text = parser.format_help().rstrip()
    out = [f"{'#' * level} `{parser.prog}`", ""]
    if summary:
        out += [summary[0].upper() + summary[1:] + ("" if summary.endswith(".") else "."), ""]
    table = _argument_table(parser)
    if table:
        out += [table]
    out += ["```text", help_text, "```", ""]
    for name, sub_help, sub in _subcommands(parser):
        out += _section(sub, [*path, name], sub_help or sub.description, min(level + 1, 6))
    return out


def _no_colour(parser: argparse.ArgumentParser) -> None:
    """Python 3.14's argparse colours help; never let escape codes into the page."""
    if hasattr(parser, "color"):
        parser.color = False


def render(root: Path) -> str:
    """The Markdown of the whole CLI reference."""
    return "\n".join(_section(_build_parser(root), [], None, 2))


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Replace the marker with the generated reference."""
    if MARKER not in markdown:
        return markdown
    root = Path(config["config_file_path"]).resolve().parent
    return markdown.replace(MARKER, render(root))
