"""A dependency-free progress bar on stderr: redrawn in place on a terminal; elsewhere (a
log, a pipe) one line at most every :data:`LOG_INTERVAL_S` seconds; nothing when disabled."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

#: Seconds between two progress lines written to a stream that is not a terminal.
LOG_INTERVAL_S = 10.0


def render_bar(done: int, total: int, label: str, width: int = 28) -> str:
    """``[#######.....]  7/12  label``."""
    filled = width * done // total if total else width
    return f"[{'#' * filled}{'.' * (width - filled)}] {done:>{len(str(total))}}/{total}  {label}"


class Progress:
    def __init__(
        self,
        *,
        enabled: bool = True,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total = 0
        self.done = 0
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stderr
        self._in_place = enabled and self.stream.isatty()
        self._clock = clock
        self._last_line: float | None = None

    def start(self, total: int) -> None:
        """Sets the number of steps to come."""
        self.total, self.done = total, 0

    def step(self, label: str) -> None:
        """Announces the step about to run."""
        if not self.enabled:
            return
        line = render_bar(self.done, self.total, label)
        self.done += 1
        if self._in_place:
            self.stream.write("\r\x1b[K" + line[:150])
        else:
            now = self._clock()
            if self._last_line is not None and now - self._last_line < LOG_INTERVAL_S:
                return
            self._last_line = now
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self._in_place:
            self.stream.write("\r\x1b[K")
            self.stream.flush()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
