"""A dependency-free progress bar on stderr: redrawn in place on a terminal, one line per
step otherwise (logs), nothing when disabled."""

from __future__ import annotations

import sys
from typing import TextIO


def render_bar(done: int, total: int, label: str, width: int = 28) -> str:
    """``[#######.....]  7/12  label``."""
    filled = width * done // total if total else width
    return f"[{'#' * filled}{'.' * (width - filled)}] {done:>{len(str(total))}}/{total}  {label}"


class Progress:
    def __init__(self, *, enabled: bool = True, stream: TextIO | None = None) -> None:
        self.total = 0
        self.done = 0
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stderr
        self._in_place = enabled and self.stream.isatty()

    def start(self, total: int) -> None:
        """Sets the number of steps to come."""
        self.total, self.done = total, 0

    def step(self, label: str) -> None:
        """Announces the step about to run."""
        if not self.enabled:
            return
        line = render_bar(self.done, self.total, label)
        if self._in_place:
            self.stream.write("\r\x1b[K" + line[:150])
        else:
            self.stream.write(line + "\n")
        self.stream.flush()
        self.done += 1

    def close(self) -> None:
        if self._in_place:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
