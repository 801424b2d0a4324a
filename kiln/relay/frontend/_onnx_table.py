"""The ONNX converter table (`@onnx_converter`, `find_converter`, `converters`) and the import errors.

Converters sit in a table keyed by (domain, op_type), each entry with the
opset range it handles; kiln's own converter modules register on first use
(`_load_builtin`), a user's when their module is imported.
"""

from __future__ import annotations

import inspect
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from kiln.errors import KilnError

if TYPE_CHECKING:
    from kiln.relay.expr import Expr
    from kiln.relay.frontend.onnx import OnnxNode


class OnnxImportError(KilnError, ValueError):
    """The ONNX model is malformed, or a node cannot be converted; the message names the node."""


class OnnxValueNeededError(OnnxImportError):
    """A value that decides a shape is computed from graph inputs; `names` are those inputs.

    `from_onnx(model, values={name: array})` imports the model with them fixed;
    `OnnxRunner` does that at run time, once per distinct value.
    """

    def __init__(self, message: str, names: Sequence[str]) -> None:
        super().__init__(message)
        self.names = tuple(names)


class OnnxUnsupportedError(OnnxImportError):
    """The model uses ops (or opsets) that no converter handles; `unsupported` lists them all."""

    def __init__(self, unsupported: Mapping[tuple[str, str, int], list[str]]) -> None:
        self.unsupported = dict(unsupported)
        lines = []
        for (domain, op_type, opset), names in sorted(self.unsupported.items()):
            shown = ", ".join(repr(n) for n in names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
            qualified = f"{domain}.{op_type}" if domain else op_type
            lines.append(f"  {qualified} (opset {opset}): {shown}{_known_versions(domain, op_type)}")
        super().__init__(f"the model uses {len(lines)} op(s) kiln cannot convert:\n" + "\n".join(lines))


# ---------------------------------------------------------------------------
# The converter table
# ---------------------------------------------------------------------------

Converter = Callable[["OnnxNode"], "Expr | Sequence[Expr | None]"]


@attrs.frozen
class ConverterEntry:
    """One converter: it handles `op_type` of `domain` from opset `since` up to `until` (inclusive)."""

    domain: str
    op_type: str
    since: int
    until: int | None
    fn: Converter
    where: str

    def handles(self, opset: int) -> bool:
        return self.since <= opset and (self.until is None or opset <= self.until)


_TABLE: dict[tuple[str, str], list[ConverterEntry]] = {}
_LOCK = threading.Lock()


def _domain(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain


def onnx_converter(
    op_type: str, domain: str = "", since: int = 1, until: int | None = None, override: bool = False
) -> Callable[[Converter], Converter]:
    """Registers the decorated function as the converter of `op_type` for opsets `since`..`until`.

    The model's opset import for `domain` picks the entry: the one with the
    highest `since` not above it (and not past its `until`). Registering the
    same (domain, op_type, since) twice is an error naming both places, unless
    `override` is true (a user replacing kiln's own converter).
    """
    if since < 1 or (until is not None and until < since):
        raise OnnxImportError(f"converter of {op_type}: bad opset range since={since} until={until}")

    def register(fn: Converter) -> Converter:
        where = _where(fn)
        entry = ConverterEntry(_domain(domain), op_type, since, until, fn, where)
        with _LOCK:
            entries = _TABLE.setdefault((entry.domain, op_type), [])
            for i, old in enumerate(entries):
                if old.since == since:
                    if not override:
                        raise OnnxImportError(
                            f"a converter of {op_type} (domain {domain!r}) since opset {since} is registered twice: "
                            f"{old.where} and {where}; pass override=True to replace it"
                        )
                    del entries[i]
                    break
            entries.append(entry)
            entries.sort(key=lambda e: e.since)
        return fn

    return register


def _where(fn: Callable[..., Any]) -> str:
    """file:line of `fn`, kiln's own files relative to the repository."""
    try:
        path, line = inspect.getsourcefile(fn) or "?", inspect.getsourcelines(fn)[1]
    except (OSError, TypeError):
        return getattr(fn, "__qualname__", repr(fn))
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    if os.path.abspath(path).startswith(root + os.sep):
        path = os.path.relpath(path, root)
    return f"{path}:{line}"


def find_converter(op_type: str, opset: int, domain: str = "") -> ConverterEntry | None:
    """The converter of `op_type` for `opset`, or None."""
    _load_builtin()
    with _LOCK:
        entries = list(_TABLE.get((_domain(domain), op_type), ()))
    best = None
    for entry in entries:
        if entry.since <= opset:
            best = entry
    return best if best is not None and best.handles(opset) else None


def converters() -> list[ConverterEntry]:
    """Every registered converter, by domain, op type and opset (`kiln ops --onnx` prints them)."""
    _load_builtin()
    with _LOCK:
        return sorted((e for es in _TABLE.values() for e in es), key=lambda e: (e.domain, e.op_type, e.since))


def _known_versions(domain: str, op_type: str) -> str:
    entries = _TABLE.get((_domain(domain), op_type))
    if not entries:
        return ""
    ranges = ", ".join(f"{e.since}-{e.until}" if e.until else f"{e.since}+" for e in entries)
    return f" (kiln converts opsets {ranges})"


_BUILTIN_LOADED = False


def _load_builtin() -> None:
    global _BUILTIN_LOADED
    if not _BUILTIN_LOADED:
        _BUILTIN_LOADED = True
        from kiln.relay.frontend import (  # noqa: F401  (they register)
            _onnx_domains,
            _onnx_dynamic,
            _onnx_elemwise,
            _onnx_index,
            _onnx_math,
            _onnx_nn,
            _onnx_quant,
            _onnx_reduce,
            _onnx_sequence,
            _onnx_signal,
            _onnx_tensor,
        )
