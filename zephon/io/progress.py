"""A tiny progress bar on stderr for slow catalog builds (no dependencies).

Shown when asked (``progress=True``) or, with ``progress=None``, when stderr is a terminal
and the work has already taken longer than :data:`DELAY_S`. Redrawn at most every
:data:`INTERVAL_S`; the finished line stays, so logs keep one summary line.
"""
from __future__ import annotations

import sys
import time
from typing import TextIO

DELAY_S = 0.5  # progress=None: stay silent for work that finishes sooner than this
INTERVAL_S = 0.1  # minimum seconds between redraws
WIDTH = 24  # characters of bar


class Progress:
    """``Progress(total, label, enabled)``; call ``advance(n)`` as work completes, then ``close()``."""

    def __init__(self, total: int, label: str, enabled: bool | None = None, stream: TextIO | None = None):
        self._stream = stream if stream is not None else sys.stderr
        if enabled is None:
            isatty = getattr(self._stream, "isatty", None)
            enabled = None if isatty is not None and isatty() else False
        self._mode = enabled  # True: always; None: a terminal, after DELAY_S; False: never
        self._total, self._label, self._done = max(int(total), 0), label, 0
        self._start = time.perf_counter()
        self._last = -INTERVAL_S
        self._drawn = False

    def advance(self, n: int = 1) -> None:
        self._done += n
        now = time.perf_counter() - self._start
        if now - self._last >= INTERVAL_S and self._visible(now):
            self._draw(now, end="")

    def close(self) -> None:
        now = time.perf_counter() - self._start
        if self._drawn or (self._mode is True):
            self._draw(now, end="\n")

    def _visible(self, now: float) -> bool:
        return self._mode is True or (self._mode is None and now >= DELAY_S)

    def _draw(self, now: float, end: str) -> None:
        fraction = self._done / self._total if self._total else 1.0
        filled = int(round(fraction * WIDTH))
        bar = "#" * filled + "-" * (WIDTH - filled)
        rate = self._done / now if now > 0 else 0.0
        self._stream.write(f"\r{self._label} [{bar}] {self._done:,}/{self._total:,} "
                           f"({fraction:.0%}, {now:.1f} s, {rate:,.0f}/s){end}")
        self._stream.flush()
        self._last, self._drawn = now, True
