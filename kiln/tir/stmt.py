"""Loop-IR statements and `PrimFunc`, the unit the back ends compile."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from kiln.tir.expr import Buffer, ExprLike, PrimExpr, TIRError, Var, as_expr


class ForKind(enum.Enum):
    """How a loop runs."""

    SERIAL = "serial"
    PARALLEL = "parallel"  # iterations split across CPU cores
    VECTORIZED = "vectorized"  # iterations become SIMD lanes (LLVM vectorizes the loop)
    UNROLLED = "unrolled"  # the body is repeated `extent` times
    THREAD_BINDING = "thread_binding"  # bound to a GPU thread axis (`thread_tag`)


def _stmts(values: Any) -> tuple[Stmt, ...]:
    return tuple(values)


def _indices(values: Any) -> tuple[PrimExpr, ...]:
    return tuple(as_expr(v) for v in values)


def _buffers(values: Any) -> tuple[Buffer, ...]:
    return tuple(values)


@attrs.frozen(eq=False, repr=False)
class Stmt:
    """Base of statements."""

    def __str__(self) -> str:
        from kiln.tir.printer import stmt_text

        return stmt_text(self)


@attrs.frozen(eq=False, repr=False)
class BufferStore(Stmt):
    """`buffer[indices] = value`."""

    buffer: Buffer
    value: PrimExpr
    indices: tuple[PrimExpr, ...] = attrs.field(converter=_indices)

    def __attrs_post_init__(self) -> None:
        if self.value.dtype != self.buffer.dtype:
            raise TIRError(f"storing {self.value.dtype} into {self.buffer.dtype} buffer {self.buffer.name}: cast first")
        if len(self.indices) != len(self.buffer.shape):
            raise TIRError(
                f"buffer {self.buffer.name} has {len(self.buffer.shape)} dims, indexed with {len(self.indices)}"
            )


@attrs.frozen(eq=False, repr=False)
class For(Stmt):
    """`for loop_var in range(min, min + extent)`, run as `kind`."""

    loop_var: Var
    min: PrimExpr
    extent: PrimExpr
    kind: ForKind
    body: Stmt
    thread_tag: str = ""  # "blockIdx.x", "threadIdx.x", ... for THREAD_BINDING
    annotations: Mapping[str, Any] = attrs.field(factory=dict)  # pragmas


@attrs.frozen(eq=False, repr=False)
class Allocate(Stmt):
    """A temporary `buffer` that lives for `body` (scope "local" or "shared")."""

    buffer: Buffer
    body: Stmt


@attrs.frozen(eq=False, repr=False)
class IfThenElse(Stmt):
    """`if cond: then_case else: else_case`."""

    cond: PrimExpr
    then_case: Stmt
    else_case: Stmt | None = None


@attrs.frozen(eq=False, repr=False)
class LetStmt(Stmt):
    """`var = value` for the statements of `body`."""

    var: Var
    value: PrimExpr
    body: Stmt


@attrs.frozen(eq=False, repr=False)
class SeqStmt(Stmt):
    """Statements in order."""

    stmts: tuple[Stmt, ...] = attrs.field(converter=_stmts)


@attrs.frozen(eq=False, repr=False)
class Evaluate(Stmt):
    """An expression evaluated for its effect (a call)."""

    value: PrimExpr


def seq(*stmts: Stmt | None) -> Stmt:
    """SeqStmt of the non-None statements, flattened; a single statement stays itself."""
    flat: list[Stmt] = []
    for s in stmts:
        if s is None:
            continue
        if isinstance(s, SeqStmt):
            flat.extend(s.stmts)
        else:
            flat.append(s)
    return flat[0] if len(flat) == 1 else SeqStmt(tuple(flat))


def for_range(
    var: Var, extent: ExprLike, body: Stmt, kind: ForKind = ForKind.SERIAL, start: ExprLike = 0
) -> For:
    """A For from `start` over `extent` iterations."""
    return For(var, as_expr(start, var.dtype), as_expr(extent, var.dtype), kind, body)


@attrs.frozen(eq=False, repr=False)
class PrimFunc:
    """A function of buffers (and scalar size vars) whose body is loop IR.

    `params` are the buffers the caller passes, in order; symbolic dims of
    their shapes are `Var`s that the caller's arrays bind.
    """

    name: str
    params: tuple[Buffer, ...] = attrs.field(converter=_buffers)
    body: Stmt
    attrs: Mapping[str, Any] = attrs.field(factory=dict)

    @property
    def size_vars(self) -> list[Var]:
        """The size variables of the parameters' shapes (a dim itself, or a factor of one such as `n*s`), in
        first-seen order."""
        from kiln.tir.functor import post_order_visit

        seen: dict[int, Var] = {}

        def note(n: Any) -> None:
            if isinstance(n, Var):
                seen.setdefault(id(n), n)

        for buf in self.params:
            for d in buf.shape:
                post_order_visit(d, note)
        return list(seen.values())

    def __str__(self) -> str:
        from kiln.tir.printer import func_text

        return func_text(self)


def buffer(name: str, shape: Sequence[ExprLike], dtype: str = "float32", scope: str = "global") -> Buffer:
    """A buffer (shapes of ints, or Vars for symbolic dims)."""
    return Buffer(name, tuple(as_expr(d) for d in shape), dtype, scope)
