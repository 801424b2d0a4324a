"""A static check that no buffer access provably falls outside its buffer.

A schedule can index a temporary past its end (a pack of `n // 48` panels read
for all `n` columns, say). The generated code would then read or write out of
bounds and could crash the process; this check refuses such loop IR at build
time instead. It is conservative: it only reports accesses whose index range,
given the enclosing loops, certainly leaves the buffer, and it does not look
inside `if` bodies (their guards may be what keeps an access in bounds).

The ranges are the simplifier's bounds (`Analyzer.interval`), symbolic where a
loop's extent is: in a tail that loop partitioning or a non-dividing split
leaves, `for i in range(min(197 - o*64, 64))`, the index `o*64 + i` is bounded
by each side of the min in turn (at most 196), not by the intervals of `o` and
`i` taken apart (3*64 + 63).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack

from kiln.tir.expr import Buffer, BufferLoad, Call, IntImm, PrimExpr, TIRError
from kiln.tir.functor import Node, post_order_visit
from kiln.tir.simplify import Analyzer
from kiln.tir.stmt import Allocate, BufferStore, For, LetStmt, PrimFunc, SeqStmt, Stmt


class OutOfBoundsError(TIRError):
    """Loop IR that accesses a buffer outside its extent."""


def _loads(e: PrimExpr) -> Iterator[BufferLoad]:
    """The loads in `e`, less the addresses of prefetches (never performed, so never out of bounds)."""
    found: list[BufferLoad] = []
    hints: set[int] = set()

    def visit(n: Node) -> None:
        if isinstance(n, BufferLoad):
            found.append(n)
        elif isinstance(n, Call) and n.name == "prefetch":
            hints.add(id(n.args[0]))

    post_order_visit(e, visit)
    return (ld for ld in found if id(ld) not in hints)


def _check_access(ana: Analyzer, func: str, buf: Buffer, indices: tuple[PrimExpr, ...], what: str) -> None:
    for axis, (index, extent) in enumerate(zip(indices, buf.shape, strict=True)):
        lo, hi = ana.interval(index)
        size = extent.value if isinstance(extent, IntImm) else None
        below = lo is not None and hi is not None and hi < 0
        above = size is not None and lo is not None and lo >= size
        partly = (lo is not None and lo < 0) or (size is not None and hi is not None and hi >= size)
        if below or above or partly:
            raise OutOfBoundsError(
                f"{func}: {what} of buffer {buf.name} at axis {axis} reaches indices [{lo}, {hi}], "
                f"outside [0, {size - 1 if size is not None else '?'}] (index {index}); "
                "check the schedule's splits and the shapes of its temporaries"
            )


def check_accesses(func: PrimFunc) -> None:
    """Raises OutOfBoundsError for an access that the enclosing loops take outside its buffer.

    Recurses once per loop-nesting level (never per statement of a sequence).
    """
    ana = Analyzer()

    def reads(e: PrimExpr) -> None:
        for load in _loads(e):
            _check_access(ana, func.name, load.buffer, load.indices, "a read")

    def walk(stmt: Stmt) -> None:
        todo = list(stmt.stmts) if isinstance(stmt, SeqStmt) else [stmt]
        for s in todo:
            if isinstance(s, SeqStmt):
                walk(s)
            elif isinstance(s, For):
                reads(s.extent)
                with ana.bound_range(s.loop_var, s.min, s.extent):
                    walk(s.body)
            elif isinstance(s, BufferStore):
                _check_access(ana, func.name, s.buffer, s.indices, "a write")
                reads(s.value)
            elif isinstance(s, LetStmt):
                # a let chain (shared values of a fused kernel) is walked in this loop, not recursively
                with ExitStack() as scope:
                    while True:
                        reads(s.value)  # loads bound to a let are as real as loads in the store
                        scope.enter_context(ana.bound_let(s.var, s.value))
                        if not isinstance(s.body, LetStmt):
                            break
                        s = s.body
                    walk(s.body)
            elif isinstance(s, Allocate):
                walk(s.body)
            # IfThenElse: skipped, its guard may be what keeps the accesses inside in bounds

    walk(func.body)
