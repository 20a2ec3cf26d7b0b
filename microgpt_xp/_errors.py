"""User errors that name the argument they are about: ``param``, as the library call spells
it (``"batch_size"``); the command line maps it to its option (``cli/_common.py``)."""

from __future__ import annotations


class ArgumentValueError(ValueError):
    """A ``ValueError`` about the argument ``param``."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param

    def __reduce__(self) -> tuple[type, tuple[str, str]]:  # through pickle (worker processes)
        return type(self), (self.param, str(self))


class ArgumentTypeError(TypeError):
    """A ``TypeError`` about the argument ``param``."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        return type(self), (self.param, str(self))
