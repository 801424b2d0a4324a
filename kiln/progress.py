"""A progress bar for relay.build, drawn on a terminal (the command line and the demo use it)."""

from __future__ import annotations

import sys
from typing import IO


class ProgressBar:
    """A `progress(done, total)` callback for relay.build that draws a bar on a terminal.

    The bar animates only when `stream` is a terminal; otherwise it writes
    nothing (so logs and pipes stay clean). `finish()` ends the bar's line.
    """

    def __init__(self, label: str = "compiling", stream: IO[str] | None = None, width: int = 30) -> None:
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.animate = bool(getattr(self.stream, "isatty", lambda: False)())
        self.drawn = False

    def __call__(self, done: int, total: int) -> None:
        if not self.animate:
            return
        filled = self.width * done // max(total, 1)
        bar = "#" * filled + "." * (self.width - filled)
        self.stream.write(f"\r{self.label} [{bar}] {done}/{total} kernels")
        self.stream.flush()
        self.drawn = True

    def finish(self) -> None:
        """Ends the bar's line, if one was drawn."""
        if self.drawn:
            self.stream.write("\n")
            self.stream.flush()
            self.drawn = False
