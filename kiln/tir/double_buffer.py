"""Double buffering of shared tiles: the fill of step k + 1 runs while step k computes (TVM's double_buffer).

A GPU schedule marks the loop over a reduction's steps `kiln.double_buffer`
(`Stage.pragma(ko, DOUBLE_BUFFER)`) where each iteration fills shared tiles
and then computes from them:

    for ko in range(n):                  # n even
        allocate S (shared): S = fill(ko); compute(ko, S)

`double_buffer` gives every such tile a twin and unrolls the loop by two, so
that each fill writes the tile the computation in flight does not read:

    allocate S, S_odd:
        S = fill(0)
        for ko2 in range(n // 2):
            S_odd = fill(2*ko2 + 1); compute(2*ko2, S)
            if 2*ko2 + 2 < n: S = fill(2*ko2 + 2)
            compute(2*ko2 + 1, S_odd)

`cuda_host.insert_syncs` then puts one barrier before each fill (the tile it
overwrites was read by the computation before it) and none between a fill and
the computation after it, which reads the other tile. Where the fills are
asynchronous copies (`cp.async`, `kiln.codegen.cuda_vector`), the copy of the
next tile is in flight while the current one is computed; a barrier waits for
the copies first. A marked loop of odd or symbolic extent, or whose body is
not fills of shared tiles followed by what reads them, is left as it is.
"""

from __future__ import annotations

import attrs

from kiln.tir.expr import Buffer, BufferLoad, IntImm, PrimExpr, Var
from kiln.tir.functor import StmtExprMutator, post_order_visit
from kiln.tir.stmt import Allocate, BufferStore, For, ForKind, IfThenElse, PrimFunc, SeqStmt, Stmt, seq
from kiln.tir.transform import _Renamer

DOUBLE_BUFFER = "kiln.double_buffer"
# The pragma of a vectorized copy into shared memory that may be asynchronous (cp.async on the CUDA back end,
# `kiln.codegen.cuda_vector`): every barrier of its kernel then waits for the copies first.
ASYNC_COPY = "kiln.async_copy"


class _Copy(_Renamer):
    """A copy of a statement at one step (`ko` substituted), its shared tiles swapped for their twins."""

    def __init__(self, vmap: dict[Var, PrimExpr], swap: dict[int, Buffer]) -> None:
        super().__init__(vmap)
        self.swap = swap

    def visit_buffer(self, buf: Buffer) -> Buffer:
        return self.swap.get(id(buf)) or super().visit_buffer(buf)


def _stores(s: Stmt) -> set[int]:
    found: set[int] = set()
    post_order_visit(s, lambda n: found.add(id(n.buffer)) if isinstance(n, BufferStore) else None)
    return found


def _loads(s: Stmt) -> set[int]:
    found: set[int] = set()
    post_order_visit(s, lambda n: found.add(id(n.buffer)) if isinstance(n, BufferLoad) else None)
    return found


class _DoubleBuffer(StmtExprMutator):
    def visit_for(self, s: For) -> Stmt:
        s = attrs.evolve(s, body=self.visit_stmt(s.body))
        if DOUBLE_BUFFER not in s.annotations:
            return s
        plain = attrs.evolve(s, annotations={k: v for k, v in s.annotations.items() if k != DOUBLE_BUFFER})
        return self._pipeline(plain) or plain

    def _pipeline(self, s: For) -> Stmt | None:
        n = s.extent
        if s.kind is not ForKind.SERIAL or not isinstance(n, IntImm) or int(n.value) < 2 or int(n.value) % 2:
            return None
        tiles: list[Buffer] = []
        body = s.body
        stmts: list[Stmt] = []
        while True:  # Allocate(S1, Seq(fill1, Allocate(S2, Seq(fill2, compute)))) as te lowers attached stages
            if isinstance(body, Allocate) and body.buffer.scope == "shared":
                tiles.append(body.buffer)
                body = body.body
            elif isinstance(body, SeqStmt) and body.stmts and isinstance(body.stmts[-1], Allocate):
                stmts.extend(body.stmts[:-1])
                body = body.stmts[-1]
            else:
                stmts.extend(body.stmts if isinstance(body, SeqStmt) else [body])
                break
        ids = {id(b) for b in tiles}
        fills = [st for st in stmts if _stores(st) and _stores(st) <= ids and not (_loads(st) & ids)]
        if not tiles or not fills or stmts[:len(fills)] != fills:
            return None
        compute = stmts[len(fills):]
        if not compute or any(_stores(st) & ids for st in compute):
            return None
        twins = {id(b): attrs.evolve(b, name=f"{b.name}_odd") for b in tiles}
        ko = s.loop_var
        ko2 = Var(f"{ko.name}_pair", ko.dtype)

        def at(part: list[Stmt], step: PrimExpr, odd: bool) -> Stmt:
            return seq(*(_Copy({ko: step}, twins if odd else {}).visit_stmt(st) for st in part))

        even, odd = ko2 * 2, ko2 * 2 + 1
        last = int(n.value) - 2
        loop = For(ko2, IntImm(ko.dtype, 0), IntImm(ko.dtype, int(n.value) // 2), ForKind.SERIAL, seq(
            at(fills, odd, True),
            at(compute, even, False),
            IfThenElse(even < last, at(fills, even + 2, False)),
            at(compute, odd, True),
        ), s.thread_tag, dict(s.annotations))
        out: Stmt = seq(at(fills, IntImm(ko.dtype, 0), False), loop)
        for b in reversed(tiles):
            out = Allocate(b, Allocate(twins[id(b)], out))
        return out


def double_buffer(func: PrimFunc) -> PrimFunc:
    """Double-buffers the shared tiles of every loop marked `kiln.double_buffer` (see the module docstring)."""
    return attrs.evolve(func, body=_DoubleBuffer().visit_stmt(func.body))


__all__ = ["ASYNC_COPY", "DOUBLE_BUFFER", "double_buffer"]
