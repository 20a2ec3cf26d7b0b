"""Progress of a long command on stderr: a tqdm bar on a terminal, elsewhere (a pipe, a
file, ``nohup``, CI) a plain line now and then (:class:`Progress`)."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator, Sized
from typing import Any, TypeVar

LINE_SECONDS = 10.0  # seconds between two progress lines off a terminal, at least
T = TypeVar("T", bound=Sized)


class Progress:
    """Counts ``total`` units (``unit``: "step", "doc", "name") from ``initial``: a tqdm bar
    on a terminal; elsewhere a line ``desc: step 120/1000 | loss 2.3412 | 3.2 s`` once a
    hundredth of the total and :data:`LINE_SECONDS` have passed since the last, and at
    :meth:`close` (a run too short to write any stays silent)."""

    def __init__(self, total: int, *, desc: str, unit: str, initial: int = 0) -> None:
        self.total, self.desc, self.unit, self.n = total, desc, unit, initial
        self.every = max(1, total // 100)
        self.start = self._last_t = time.monotonic()
        self._last_n, self._lines, self._closed = initial, 0, False
        self._postfix: dict[str, str] = {}
        self._bar: Any = None
        try:
            terminal = sys.stderr.isatty()
        except (AttributeError, ValueError):
            terminal = False
        if terminal:
            from tqdm import tqdm

            self._bar = tqdm(total=total, initial=initial, desc=desc, unit=unit, file=sys.stderr)

    def update(self, n: int, **postfix: str) -> None:
        """Now at ``n`` units done; ``postfix`` values (formatted) are shown beside."""
        self.n = n
        self._postfix.update(postfix)
        if self._bar is not None:
            self._bar.set_postfix(self._postfix, refresh=False)
            self._bar.update(n - self._bar.n)
        elif n - self._last_n >= self.every and time.monotonic() - self._last_t >= LINE_SECONDS:
            self._line()

    def counted(self, batches: Iterable[T]) -> Iterator[T]:
        """The ``batches``, each counted as it is taken."""
        for batch in batches:
            self.update(self.n + len(batch))
            yield batch

    def close(self) -> None:
        """End the bar, or write the last line (if a unit was counted since the last)."""
        if not self._closed:
            self._closed = True
            if self._bar is not None:
                self._bar.close()
            elif self._lines and self.n != self._last_n:
                self._line()

    def _line(self) -> None:
        now = time.monotonic()
        parts = [f"{self.desc}: {self.unit} {self.n}/{self.total}"]
        parts += [f"{key} {value}" for key, value in self._postfix.items()]
        sys.stderr.write(" | ".join([*parts, f"{now - self.start:.1f} s"]) + "\n")
        sys.stderr.flush()
        self._last_n, self._last_t = self.n, now
        self._lines += 1

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
