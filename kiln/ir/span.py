"""Spans: where an expression came from (a parsed file's line and column, or a Python call site)."""

from __future__ import annotations

import contextlib
import contextvars
import os
import sys
from collections.abc import Iterator
from types import FrameType

import attrs

_KILN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Frames in these packages build expressions on a user's behalf; the span is the user's line.
_LIBRARY_DIRS = tuple(os.path.join(_KILN_DIR, d) + os.sep for d in ("ir", "relay", "registry"))


@attrs.frozen
class Span:
    """A source position: `source` is a file name, `<text>`, an ONNX node name, ..."""

    source: str
    line: int = 0
    column: int = 0

    def __str__(self) -> str:
        if self.line <= 0:
            return self.source
        return f"{self.source}:{self.line}:{self.column}" if self.column else f"{self.source}:{self.line}"

    @staticmethod
    def from_caller() -> Span | None:
        """Where a user built an expression: the span of an enclosing `span_scope`, else the
        first Python frame outside kiln's IR and op library."""
        scoped = _SCOPE.get()
        if scoped is not None:
            return scoped
        frame: FrameType | None = sys._getframe(1)
        while frame is not None:
            path = frame.f_code.co_filename
            if not os.path.abspath(path).startswith(_LIBRARY_DIRS):
                return Span(_short(path), frame.f_lineno)
            frame = frame.f_back
        return None


def _short(path: str) -> str:
    cwd = os.getcwd()
    return os.path.relpath(path, cwd) if path.startswith(cwd + os.sep) else path


_SCOPE: contextvars.ContextVar[Span | None] = contextvars.ContextVar("kiln_span_scope", default=None)


@contextlib.contextmanager
def span_scope(span: Span | None) -> Iterator[None]:
    """Expressions built inside take `span` (a frontend's node name) instead of the Python call site."""
    token = _SCOPE.set(span)
    try:
        yield
    finally:
        _SCOPE.reset(token)
