"""The host side of the CUDA back end: kernels, launch shapes and barriers of a PrimFunc.

Like TVM's SplitHostDevice, the host part is the top level of the (flattened)
function body: each top-level statement holding loops bound to GPU threads
(`ForKind.THREAD_BINDING`, `thread_tag` "blockIdx.x" ... "threadIdx.z") becomes
one kernel, launched in order; top-level `Allocate`s in global scope between
them become device workspaces that the module allocates and passes in. A
top-level statement without any bound loop is refused: bind it.

Launch shapes: the block size per axis is the largest extent of the loops
bound to that `threadIdx` axis (a constant); the grid per axis the largest
extent of its `blockIdx` loops, which may use symbolic sizes (`eval_int` at
launch). A `blockIdx` loop must be outside every unbound and `threadIdx` loop
(blocks cannot run in sequence); a block axis bound twice in one nest is refused.
A `threadIdx` loop inside another loop bound to the same axis spreads its
iterations over the same threads (TVM's cooperative fetching: the threads that
each compute a part of a tile fill the block's shared copy together); the
inner loop's iterations must not depend on each other.

Barriers: `syncthreads()` is `Evaluate(Call("syncthreads"))`, an intrinsic that
only this back end knows, by name (`tir.call` would refuse it: `tir.INTRINSICS`
is shared with the llvm back end). `insert_syncs` also places barriers itself
at block level (outside `threadIdx` loops): between two statements of a
sequence, right before the first statement that reads shared memory written
since the last barrier, or writes shared memory read since then (or written
through another index expression: writes through the same one are taken to be
the same thread's, as TVM's ThreadSync does).
A serial loop is followed around its back edge (an iteration starts with
what the previous one left outstanding), so a loop that refills a tile gets
one barrier before the refill and one before the tile is read, as in
hand-written CUDA. The statements at block level are executed by all threads
(`kiln.codegen.cuda` runs the ones outside some thread axis on index 0 of it,
inside an `if` that never holds a barrier). Inside a `threadIdx` loop only an
explicit `syncthreads()` synchronizes, unless it binds threadIdx loops again
inside (a cooperative scope): its body is synchronized as block level is. An
all-reduce across threads (`kiln.warp_allreduce`) brings its own barriers
around the shared scratch it uses (`kiln.codegen.cuda_allreduce`).
"""

from __future__ import annotations

from collections.abc import Hashable

import attrs

from kiln.codegen.jit import CodegenError
from kiln.runtime.cuda_module import BLOCK_LIMITS, GRID_LIMITS, Grid
from kiln.tir.expr import (
    Buffer,
    BufferLoad,
    Call,
    IntImm,
    PrimExpr,
)
from kiln.tir.functor import Node, post_order_visit, structural_key
from kiln.tir.stmt import (
    Allocate,
    BufferStore,
    Evaluate,
    For,
    ForKind,
    IfThenElse,
    LetStmt,
    PrimFunc,
    SeqStmt,
    Stmt,
    seq,
)

THREAD_TAGS = ("blockIdx.x", "blockIdx.y", "blockIdx.z", "threadIdx.x", "threadIdx.y", "threadIdx.z")
SYNC_NAME = "syncthreads"


def syncthreads() -> Evaluate:
    """`__syncthreads()` as a loop-IR statement (see the module docstring)."""
    return Evaluate(Call("int32", SYNC_NAME, ()))


# -- splitting the function into kernels ----------------------------------------------------


def _first_loop(s: Stmt) -> For | None:
    found: list[For] = []
    post_order_visit(s, lambda n: found.append(n) if isinstance(n, For) else None)
    return found[-1] if found else None  # post order: the outermost comes last


def split_host(func: PrimFunc) -> tuple[list[Buffer], list[Stmt]]:
    """The workspaces (top-level global allocations) and kernel bodies of flattened `func`, in order."""
    workspaces: list[Buffer] = []
    kernels: list[Stmt] = []
    todo: list[Stmt] = [func.body]
    while todo:
        s = todo.pop()
        if isinstance(s, SeqStmt):
            todo.extend(reversed(s.stmts))
        elif isinstance(s, Allocate) and s.buffer.scope == "global":
            workspaces.append(s.buffer)
            todo.append(s.body)
        elif isinstance(s, Allocate):
            raise CodegenError(
                f"{func.name}: temporary {s.buffer.name} in {s.buffer.scope!r} scope is allocated outside every "
                "kernel; compute it at a loop bound to a GPU thread (compute_at), or leave it in global scope"
            )
        elif bound_tags(s):
            kernels.append(s)
        else:
            loop = _first_loop(s)
            what = f"loop {loop.loop_var.name}" if loop is not None else f"statement {type(s).__name__}"
            raise CodegenError(
                f"{func.name}: {what} is not bound to a GPU thread on a cuda target; bind it "
                "(s[C].bind(axis, te.thread_axis('blockIdx.x')) / 'threadIdx.x') so that it runs in a kernel "
                "(loop nests without bound loops compile for llvm targets)"
            )
    return workspaces, kernels


# -- per-kernel analysis ---------------------------------------------------------------------


def is_sync(s: Stmt) -> bool:
    return isinstance(s, Evaluate) and isinstance(s.value, Call) and s.value.name == SYNC_NAME


def _shared_access(s: Node) -> tuple[set[int], set[tuple[int, Hashable]]]:
    """The ids of the shared buffers that `s` reads, and (id, index key) of its writes to shared buffers."""
    reads: set[int] = set()
    writes: set[tuple[int, Hashable]] = set()

    def visit(n: Node) -> None:
        if isinstance(n, BufferLoad) and n.buffer.scope == "shared":
            reads.add(id(n.buffer))
        elif isinstance(n, BufferStore) and n.buffer.scope == "shared":
            writes.add((id(n.buffer), tuple(structural_key(i) for i in n.indices)))

    post_order_visit(s, visit)
    return reads, writes


def has_sync(s: Stmt) -> bool:
    found: list[bool] = []
    post_order_visit(s, lambda n: found.append(True) if isinstance(n, Stmt) and is_sync(n) else None)
    return bool(found)


# Since the last barrier: the shared buffers (by id) read, and the (buffer id, index key) written.
Pending = tuple[frozenset[int], frozenset[tuple[int, Hashable]]]
_NONE: Pending = (frozenset(), frozenset())
_MAX_FIXPOINT = 8


def insert_syncs(s: Stmt) -> Stmt:
    """`s` with `__syncthreads()` where block-level statements hand shared memory to each other.

    Only statements outside `threadIdx` loops are considered (see the module docstring).
    """
    return _Syncs().sync(s, _NONE)[0]


def _union(a: Pending, b: Pending) -> Pending:
    return a[0] | b[0], a[1] | b[1]


class _Syncs:
    """One `insert_syncs` walk, which finds each statement's shared accesses once (asked at every level of a
    nest and in every fixpoint round, the walks were quadratic in the kernel's size)."""

    def __init__(self) -> None:
        self.accesses: dict[int, tuple[Stmt, Pending]] = {}  # id -> (the statement, held: its id stays its own)

    def access(self, s: Stmt) -> Pending:
        hit = self.accesses.get(id(s))
        if hit is None:
            hit = self.accesses[id(s)] = (s, _shared_access_frozen(s))
        return hit[1]

    def sync(self, s: Stmt, pend: Pending) -> tuple[Stmt, Pending]:
        """`s` with the barriers it needs when entered with `pend` outstanding, and what is outstanding after."""
        if is_sync(s):
            return s, _NONE
        if isinstance(s, SeqStmt):
            out: list[Stmt] = []
            for child in s.stmts:
                new, pend = self.sync(child, pend)
                out.append(new)
            return seq(*out) if out else s, pend
        if isinstance(s, Allocate):
            body, pend = self.sync(s.body, pend)
            return Allocate(s.buffer, body), pend
        if isinstance(s, LetStmt):
            body, pend = self.sync(s.body, pend)
            return LetStmt(s.var, s.value, body), pend
        if isinstance(s, IfThenElse):
            if _conflict(pend, *self.access(s)):  # the barrier goes before it: in a cooperative scope
                branch, after = self.sync(s, _NONE)  # the condition may differ between the threads
                return seq(syncthreads(), branch), after
            then, after = self.sync(s.then_case, pend)
            if s.else_case is None:
                return IfThenElse(s.cond, then), _union(after, pend)
            other, after_other = self.sync(s.else_case, pend)
            return IfThenElse(s.cond, then, other), _union(after, after_other)
        if isinstance(s, For) and (s.thread_tag.startswith("blockIdx") or _cooperative(s)):  # all threads run it
            body, pend = self.sync(s.body, pend)
            return attrs.evolve(s, body=body), pend
        if isinstance(s, For) and s.kind is not ForKind.THREAD_BINDING:
            if _conflict(pend, *self.access(s)):  # one barrier before the loop, not one per iteration
                loop, after = self.sync(s, _NONE)
                return seq(syncthreads(), loop), after
            # an iteration starts with what was outstanding before the loop or after the previous iteration
            head = pend
            for _ in range(_MAX_FIXPOINT):
                body, after = self.sync(s.body, head)
                if _union(pend, after) == head:
                    return attrs.evolve(s, body=body), head
                head = _union(pend, after)
            body, _ = self.sync(s.body, _NONE)  # no fixed point: a barrier atop each iteration is always safe
            return attrs.evolve(s, body=seq(syncthreads(), body)), self.access(s)
        # a statement run by the threads in parallel (a threadIdx loop) or a single store: one unit
        reads, writes = self.access(s)
        if _conflict(pend, reads, writes):
            return seq(syncthreads(), s), (reads, writes)
        return s, _union(pend, (reads, writes))


def _cooperative(s: For) -> bool:
    """Whether `s` is a threadIdx loop whose body binds threadIdx loops again: a per-thread scope in which
    the block works together (a tile filled through the same threads), so its body is synchronized inside."""
    return s.thread_tag.startswith("threadIdx") and any(t.startswith("threadIdx") for t in bound_tags(s.body))


def _conflict(pend: Pending, reads: frozenset[int], writes: frozenset[tuple[int, Hashable]]) -> bool:
    """Whether accesses after `pend` need a barrier first: a read of a buffer written, a write of one read,
    or a write of one written through another index. Two writes through one index expression are made by
    the same thread (TVM's ThreadSync assumes so too), as when one statement writes a tile in successive
    iterations of a loop."""
    written = {b for b, _ in pend[1]}
    if reads & written or {b for b, _ in writes} & pend[0]:
        return True
    return any(b in written and (b, key) not in pend[1] for b, key in writes)


def _shared_access_frozen(s: Stmt) -> Pending:
    r, w = _shared_access(s)
    return frozenset(r), frozenset(w)


@attrs.define
class Launch:
    """The launch shape of one kernel, gathered from its bound loops."""

    block: dict[str, int] = attrs.field(factory=dict)  # threadIdx tag -> block extent
    grid: dict[str, list[PrimExpr]] = attrs.field(factory=dict)  # blockIdx tag -> distinct extents

    def shape(self, func: str, max_threads: int) -> tuple[tuple[int, int, int], Grid]:
        """(block, grid) per axis x, y, z, checked against CUDA's limits and the target's `max_threads`."""
        bx, by, bz = (self.block.get(f"threadIdx.{a}", 1) for a in "xyz")
        for a, n, limit in zip("xyz", (bx, by, bz), BLOCK_LIMITS, strict=True):
            if n > limit:
                raise CodegenError(f"{func}: threadIdx.{a} extent {n} exceeds the CUDA limit of {limit}")
        if bx * by * bz > max_threads:
            raise CodegenError(f"{func}: {bx * by * bz} threads per block ({bx} x {by} x {bz}) exceed "
                               f"the target's max-threads-per-block {max_threads}")
        gx, gy, gz = (tuple(self.grid.get(f"blockIdx.{a}", [])) for a in "xyz")
        grid = (gx, gy, gz)
        for a, extents, limit in zip("xyz", grid, GRID_LIMITS, strict=True):
            for e in extents:
                if isinstance(e, IntImm) and e.value > limit:
                    raise CodegenError(f"{func}: blockIdx.{a} extent {e.value} exceeds the CUDA limit of {limit}")
        return (bx, by, bz), grid


def scan_launch(func: str, body: Stmt) -> Launch:
    """Checks where `body`'s loops are bound, and gathers the block and grid extents."""
    launch = Launch()
    # (stmt, enclosing bound tags, the innermost enclosing loop that blocks may not be inside)
    stack: list[tuple[Stmt, frozenset[str], For | None]] = [(body, frozenset(), None)]
    while stack:
        s, tags, blocker = stack.pop()
        if isinstance(s, For):
            inner_blocker = blocker
            if s.kind is ForKind.THREAD_BINDING:
                tag = s.thread_tag
                name = s.loop_var.name
                if tag not in THREAD_TAGS:
                    raise CodegenError(f"{func}: loop {name} is bound to {tag!r}; the cuda back end knows "
                                       f"{', '.join(THREAD_TAGS)}")
                if tag in tags and tag.startswith("blockIdx"):
                    raise CodegenError(f"{func}: loop {name} is bound to {tag}, inside another loop bound to "
                                       f"{tag}; each block axis can be bound once per loop nest")
                if tag.startswith("blockIdx"):
                    if blocker is not None:
                        raise CodegenError(
                            f"{func}: loop {name} is bound to {tag} inside loop {blocker.loop_var.name}"
                            f"{' (bound to ' + blocker.thread_tag + ')' if blocker.thread_tag else ''}: blocks "
                            "cannot run in sequence; put the blockIdx loops outermost"
                        )
                    known = launch.grid.setdefault(tag, [])
                    if not any(str(e) == str(s.extent) for e in known):
                        known.append(s.extent)
                else:
                    if not isinstance(s.extent, IntImm):
                        raise CodegenError(f"{func}: loop {name} is bound to {tag} with extent {s.extent}; thread "
                                           "extents must be constants (split by a constant factor first)")
                    launch.block[tag] = max(launch.block.get(tag, 1), int(s.extent.value))
                    inner_blocker = s
                tags = tags | {tag}
            else:
                inner_blocker = s
            stack.append((s.body, tags, inner_blocker))
        elif isinstance(s, SeqStmt):
            stack.extend((c, tags, blocker) for c in s.stmts)
        elif isinstance(s, (Allocate, LetStmt)):
            stack.append((s.body, tags, blocker))
        elif isinstance(s, IfThenElse):
            stack.append((s.then_case, tags, blocker))
            if s.else_case is not None:
                stack.append((s.else_case, tags, blocker))
    return launch


def bound_tags(s: Stmt) -> set[str]:
    """The thread tags of the loops in `s` bound to GPU threads. Only statements are walked: no expression
    holds a loop (a walk through every index expression was most of the CUDA back end's time)."""
    tags: set[str] = set()
    todo = [s]
    while todo:
        n = todo.pop()
        if isinstance(n, SeqStmt):
            todo.extend(n.stmts)
        elif isinstance(n, For):
            if n.kind is ForKind.THREAD_BINDING:
                tags.add(n.thread_tag)
            todo.append(n.body)
        elif isinstance(n, (Allocate, LetStmt)):
            todo.append(n.body)
        elif isinstance(n, IfThenElse):
            todo.append(n.then_case)
            if n.else_case is not None:
                todo.append(n.else_case)
    return tags
