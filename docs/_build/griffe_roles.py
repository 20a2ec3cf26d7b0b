"""A griffe extension that turns the Sphinx roles of the package's docstrings
(``:func:`x```, ``:class:`~a.b.C```, ``:meth:`m```, ``:mod:`m```, ...) into mkdocstrings
cross-references.

The name is resolved in the docstring's own scope (so ``:meth:`to_dict``` inside a class
finds the class's method). The reference is emitted as an *optional* autoref: when its
target is not rendered anywhere on the site it becomes plain code instead of a broken
link, so that ``mkdocs build --strict`` does not fail on a reference to, say, a private
helper.
"""

from __future__ import annotations

import html
import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|attr|data|exc|obj|const):`(~?)([^`<>]+)`")


class SphinxRoles(griffe.Extension):
    """Rewrite Sphinx roles in every docstring once the object tree is complete."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        """Rewrite ``obj``'s docstring (if any) in place."""
        if obj.docstring is None:
            return
        obj.docstring.value = _ROLE.sub(lambda m: _crossref(obj, m), obj.docstring.value)


def _crossref(obj: griffe.Object, match: re.Match[str]) -> str:
    short, name = match.group(1) == "~", match.group(2).strip()
    try:
        identifier = name if name.startswith("microgpt_xp") else obj.resolve(name)
    except (griffe.NameResolutionError, KeyError, AttributeError):
        identifier = name
    title = name.rsplit(".", 1)[-1] if short else name
    return (
        f'<autoref identifier="{html.escape(identifier)}" optional>'
        f"<code>{html.escape(title)}</code></autoref>"
    )
