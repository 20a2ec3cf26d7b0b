"""Progress of a long command on stderr, wherever stderr goes: a tqdm bar on a terminal;
elsewhere (a pipe, a file, ``nohup``, CI) a plain line every ``every`` units or every
~10 s, whichever is rarer, and one at the end."""

from __future__ import annotations

import sys
import time
from typing import Any

#: Seconds between two progress lines off a terminal, at least.
LINE_SECONDS = 10.0


class Progress:
    """Counts ``total`` units (``unit``: "step", "doc", "name") from ``initial``.

    On a terminal a tqdm bar shows the position and ``postfix`` values; elsewhere,
    :meth:`update` writes ``desc: step 120/1000 | loss 2.3412 | 3.2 s`` once both ``every``
    units (default: a hundredth of the total, at least 1) and :data:`LINE_SECONDS`
    seconds have passed since the last line, and :meth:`close` writes the last one (after
    a run long enough to have written any: a short run stays silent).
    """

    def __init__(
        self,
        total: int,
        *,
        desc: str,
        unit: str,
        initial: int = 0,
        every: int | None = None,
        seconds: float | None = None,
    ) -> None:
        self.total, self.desc, self.unit, self.n = total, desc, unit, initial
        self.every = every if every is not None else max(1, total // 100)
        self.seconds = LINE_SECONDS if seconds is None else seconds
        self.start = time.monotonic()
        self._last_n, self._last_t = initial, self.start
        self._postfix: dict[str, str] = {}
        self._bar: Any = None
        self._closed = False
        self._lines = 0
        if _is_terminal():
            from tqdm import tqdm

            self._bar = tqdm(total=total, initial=initial, desc=desc, unit=unit, file=sys.stderr)

    def update(self, n: int, **postfix: str) -> None:
        """Now at ``n`` units done; ``postfix`` values (already formatted) are shown beside."""
        self.n = n
        self._postfix.update(postfix)
        if self._bar is not None:
            self._bar.set_postfix(self._postfix, refresh=False)
            self._bar.update(n - self._bar.n)
            return
        now = time.monotonic()
        if n - self._last_n >= self.every and now - self._last_t >= self.seconds:
            self._line(now)

    def close(self) -> None:
        """End the bar, or write the last line (if a unit was counted since the last)."""
        if self._closed:
            return
        self._closed = True
        if self._bar is not None:
            self._bar.close()
        elif self._lines and self.n != self._last_n:
            self._line(time.monotonic())

    def _line(self, now: float) -> None:
        parts = [f"{self.desc}: {self.unit} {self.n}/{self.total}"]
        parts += [f"{key} {value}" for key, value in self._postfix.items()]
        parts.append(f"{now - self.start:.1f} s")
        sys.stderr.write(" | ".join(parts) + "\n")
        sys.stderr.flush()
        self._last_n, self._last_t = self.n, now
        self._lines += 1

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _is_terminal() -> bool:
    try:
        return bool(sys.stderr.isatty())
    except (AttributeError, ValueError):
        return False
