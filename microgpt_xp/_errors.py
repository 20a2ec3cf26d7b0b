"""User errors that name the argument they are about.

Every error a user can fix by changing one argument is raised as
:class:`ArgumentValueError` or :class:`ArgumentTypeError` (still a ``ValueError`` or a
``TypeError``) with ``param``, the name of that argument as the library call spells it
(``"batch_size"``, ``"temperature"``, ``"checkpoint"``). The command line maps ``param``
to its option in one table (``cli/_common.py``); nothing parses a message.
"""

from __future__ import annotations


class ArgumentValueError(ValueError):
    """A ``ValueError`` about the argument ``param``."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


class ArgumentTypeError(TypeError):
    """A ``TypeError`` about the argument ``param``."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param
