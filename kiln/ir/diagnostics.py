"""Diagnostics: an error message with its span and the IR around the node it is about.

The IR layer does not print Relay; whoever raises a diagnostic passes an
`excerpt` function (Relay's printer supplies one that marks the failing call).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs

from kiln.errors import KilnError
from kiln.ir.span import Span


@attrs.frozen
class Diagnostic:
    """One error: the message, the node it is about, and where that node came from."""

    message: str
    node: Any
    span: Span | None

    def render(self, excerpt: str | None = None) -> str:
        """The message, `--> span`, and the excerpt of the IR with the node marked."""
        lines = [f"error: {self.message}"]
        if self.span is not None:
            lines.append(f"  --> {self.span}")
        if excerpt:
            lines.extend("   | " + line for line in excerpt.splitlines())
        return "\n".join(lines)


def render_all(
    diagnostics: Sequence[Diagnostic], excerpt: Callable[[Any], str | None] | None = None, where: str = ""
) -> str:
    """Every diagnostic, rendered, under a line that counts them."""
    count = len(diagnostics)
    head = f"{count} error{'s' if count != 1 else ''}{where}:"
    body = "\n\n".join(d.render(excerpt(d.node) if excerpt else None) for d in diagnostics)
    return f"{head}\n{body}"


class DiagnosticError(KilnError):
    """An error carrying one or more diagnostics."""

    def __init__(self, diagnostics: Sequence[Diagnostic], message: str) -> None:
        super().__init__(message)
        self.diagnostics = list(diagnostics)
