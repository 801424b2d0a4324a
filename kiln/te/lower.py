"""`te.lower`: a schedule to a `tir.PrimFunc`.

The steps, in order:

1. Buffers: the `args` become the function's parameters; every other stage
   that is not inlined gets a temporary (`Allocate`) in its scope.
2. Inlining: inlined stages' expressions are substituted into their readers.
   Each inlined stage is expanded once per distinct tuple of indices it is
   read at, straight from its own body with its axes bound to those indices
   (loads of other inlined stages inside it expanded the same way), from an
   explicit work list: linear in a chain's length, no recursion per stage, and
   a stage read twice at the same indices gives one shared sub-expression.
3. Bound inference, consumers first: a stage at the root covers its whole
   shape; a stage placed with `compute_at` covers the region its readers
   touch in one iteration of the loop it is attached to (the readers' inner
   loops relaxed over their ranges; affine indices give exact regions, other
   indices fall back to the whole extent). Its temporary is that region. A
   "shared" stage is the whole block's: its region is also relaxed over the
   threadIdx-bound loops around its attach point.
4. Loop nests: each stage's leaf axes become `For`s (extents passed down the
   split/fuse relations, root indices passed back up); reductions store the
   identity before the first reduction loop and accumulate inside it;
   iterations past an extent (a non-dividing split, a region past the edge of
   the tensor) are guarded with `IfThenElse`, placed right inside the loop
   of the innermost variable they depend on, and left out where the bounds
   prove them true. A `prefetch` puts, at the top of its loop's body, a loop of
   `prefetch` calls over the cache lines of the box the next iterations read.
   A reduction with an axis bound to threadIdx.x accumulates per thread in a
   register, then combines across the threads with `kiln.warp_allreduce`.
5. Shared values: inlining leaves a value that several readers use as one node
   with several parents; `tir.share.bind_shared` makes each such value (and
   each expression taller than `tir.share.MAX_HEIGHT`) a `LetStmt` around the
   statement that uses it, so the loop IR is a tree as large as the DAG and
   every later walk (printer, simplifier, code generators, cache key) is linear.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from contextlib import ExitStack

import attrs

from kiln.ir.dtype import DataType
from kiln.te.arith import SymInterval, free_vars, hull, loads, rebuild, relax, substitute, transform
from kiln.te.schedule import AttachType, Fuse, IterAttr, Schedule, ScheduleError, Split, Stage
from kiln.te.tensor import IterKind, IterVar, PlaceholderOp, Reduce, Tensor, TensorBuffer, children
from kiln.tir import expr as tx
from kiln.tir.allreduce import allreduce
from kiln.tir.expr import Buffer, BufferLoad, PrimExpr, Var
from kiln.tir.share import bind_shared
from kiln.tir.simplify import Analyzer, Linear
from kiln.tir.stmt import Allocate, BufferStore, Evaluate, For, ForKind, IfThenElse, PrimFunc, Stmt, seq
from kiln.tir.stmt import buffer as tir_buffer

Loops = list[tuple[Var, PrimExpr]]  # (var, extent), innermost first
_CACHE_LINE = 64  # bytes, on every CPU kiln targets


@attrs.define(eq=False)
class _Info:
    """What lowering knows about one stage that is not inlined."""

    stage: Stage
    body: PrimExpr  # the op's body with inlined stages substituted
    buffer: Buffer | None = None
    readers: list[Stage] = attrs.field(factory=list)
    children: dict[IterVar, list[Stage]] = attrs.field(factory=dict)
    rmin: dict[IterVar, PrimExpr] = attrs.field(factory=dict)  # root axes' region
    rext: dict[IterVar, PrimExpr] = attrs.field(factory=dict)
    ext: dict[IterVar, PrimExpr] = attrs.field(factory=dict)  # every axis's loop extent
    offset: dict[IterVar, PrimExpr] = attrs.field(factory=dict)  # every axis's index in leaf vars


def _conj(conds: Sequence[PrimExpr]) -> PrimExpr:
    out = conds[0]
    for c in conds[1:]:
        out = tx.binary(tx.And, out, c)
    return out


class _Lowering:
    def __init__(self, sch: Schedule, args: Sequence[Tensor], name: str) -> None:
        self.sch = sch
        self.name = name
        # tir's integer arithmetic, with no variable bounds: canonical linear forms and simplified
        # index expressions, memoized per node for the whole lowering
        self.ana = Analyzer()
        self.params: list[Buffer] = []
        self.placeholder_bufs: dict[int, Buffer] = {}
        self.info: dict[Stage, _Info] = {}
        self.inlined: set[Stage] = set()  # inlined stages met so far, in the schedule's (producers first) order
        # inlining's scopes: an inlined stage with its axes bound to the indices it is read at; scope 0
        # binds nothing (the body of a stage that is not inlined)
        self.scopes: dict[tuple[Stage, tuple[Hashable, ...]], int] = {}
        self.scope_vmaps: list[dict[Var, PrimExpr]] = [{}]
        self.expanded: dict[tuple[int, int], PrimExpr] = {}  # (scope, id of a node of a stage's body) -> expansion
        arg_stages: dict[Stage, Buffer] = {}
        for t in args:
            if not isinstance(t, Tensor):
                raise ScheduleError(f"lower {name!r}: args must be tensors, got {t!r}")
            buf = tir_buffer(t.name, t.shape, t.dtype)
            self.params.append(buf)
            if isinstance(t.op, PlaceholderOp):
                self.placeholder_bufs.setdefault(id(t.op), buf)
                continue
            stage = sch.stage_of(t)
            if stage is None:
                raise ScheduleError(f"lower {name!r}: tensor {t.name!r} is not computed by this schedule")
            if stage in arg_stages:
                raise ScheduleError(f"lower {name!r}: tensor {t.name!r} is given twice in args")
            arg_stages[stage] = buf
        for t in sch.outputs:
            if sch[t] not in arg_stages:
                raise ScheduleError(f"lower {name!r}: output {t.name!r} must be one of args")
        self.arg_stages = arg_stages

    # -- 1 and 2: buffers, inlining, readers --------------------------------------------
    def _stage_of_load(self, e: PrimExpr) -> tuple[Tensor, Stage | None] | None:
        if isinstance(e, BufferLoad) and isinstance(e.buffer, TensorBuffer) and e.buffer.tensor is not None:
            t = e.buffer.tensor
            return t, self.sch.stage_of(t)
        return None

    def _scope(self, st: Stage, indices: tuple[PrimExpr, ...]) -> int:
        """The scope of inlined stage `st` read at `indices` (expanded ones), made on first use."""
        key = (st, tuple(("imm", i.dtype, i.value) if isinstance(i, tx.IntImm) else id(i) for i in indices))
        scope = self.scopes.get(key)
        if scope is None:  # the vmap keeps `indices` alive, so their ids in `key` stay theirs
            scope = self.scopes[key] = len(self.scope_vmaps)
            self.scope_vmaps.append({iv.var: i for iv, i in zip(st.op.axis, indices, strict=True)})
        return scope

    def _inline(self, body: PrimExpr) -> PrimExpr:
        """`body` (a stage's own) with every load of an inlined stage replaced by that stage's expression.

        The same as substituting each inlined stage's expanded expression into its
        readers, but each (stage, indices) scope is built once, straight from the
        stage's body. Memo keys are node ids of stage bodies, which the schedule keeps alive.
        """
        done = self.expanded
        stack: list[tuple[PrimExpr, int]] = [(body, 0)]
        while stack:
            e, scope = stack[-1]
            if (scope, id(e)) in done:
                stack.pop()
                continue
            kids = children(e)
            todo = [(k, scope) for k in reversed(kids) if (scope, id(k)) not in done]
            if todo:
                stack.extend(todo)
                continue
            new = tuple(done[scope, id(k)] for k in kids)
            hit = self._stage_of_load(e)
            if hit is not None and hit[1] in self.inlined:
                st = hit[1]
                inner = self._scope(st, new)
                out = done.get((inner, id(st.op.body)))
                if out is None:
                    stack.append((st.op.body, inner))  # back to `e` once that is done
                    continue
            elif isinstance(e, Var):
                out = self.scope_vmaps[scope].get(e, e)
            else:
                out = rebuild(e, new)
            done[scope, id(e)] = out
            stack.pop()
        return done[0, id(body)]

    def _prepare(self) -> list[Stage]:
        live: list[Stage] = []
        for st in self.sch.stages:
            if st.attach_type is AttachType.INLINE:
                if st in self.arg_stages:
                    raise ScheduleError(f"lower {self.name!r}: stage {st.name!r} is an argument and cannot be inlined")
                self.inlined.add(st)
                continue
            info = _Info(st, self._inline(st.op.body))
            if st in self.arg_stages:
                if st.attach_type is AttachType.SCOPE:
                    raise ScheduleError(
                        f"lower {self.name!r}: stage {st.name!r} is an argument; it must be computed at the root"
                    )
                info.buffer = self.arg_stages[st]
            self.info[st] = info
            live.append(st)
        for st in live:
            for ld in loads(self.info[st].body):
                hit = self._stage_of_load(ld)
                if hit is None:
                    continue
                t, producer = hit
                if producer is None:
                    if id(t.op) not in self.placeholder_bufs:
                        raise ScheduleError(
                            f"lower {self.name!r}: stage {st.name!r} reads placeholder {t.name!r}, which is not in args"
                        )
                    continue
                readers = self.info[producer].readers
                if st not in readers:
                    readers.append(st)
        for st in live:
            if st.attach_type is AttachType.SCOPE:
                parent, iv = st.attach_stage, st.attach_ivar
                assert parent is not None and iv is not None
                if parent not in self.info:
                    raise ScheduleError(f"stage {st.name!r} is computed at stage {parent.name!r}, which is inlined")
                if not any(x is iv for x in parent.leaf_iter_vars):
                    raise ScheduleError(
                        f"stage {st.name!r} is computed at axis {iv.name!r} of stage {parent.name!r}, "
                        "which is no longer a leaf axis there (it was split or fused afterwards)"
                    )
                self.info[parent].children.setdefault(iv, []).append(st)
        return live

    # -- 3: bounds ----------------------------------------------------------------------
    def _ceildiv(self, e: PrimExpr, f: int) -> PrimExpr:
        return e if f == 1 else self.ana.simplify(tx.binary(tx.FloorDiv, e + (f - 1), f))

    def _extent(self, rng: SymInterval) -> PrimExpr:
        """The number of values in an interval, as an expression."""
        return self.ana.expr_of(rng[1].sub(rng[0]).plus(1))

    def _bounding_box(
        self, reads: Sequence[BufferLoad], ndim: int, vmap: dict[Var, PrimExpr], loops: Loops
    ) -> list[SymInterval | None]:
        """Per axis, the index range `reads` cover with `vmap` substituted and `loops` relaxed over
        their ranges; None for an axis where some index is not affine (or nothing is read)."""
        box: list[SymInterval | None] = []
        for d in range(ndim):
            rngs = [relax(substitute(ld.indices[d], vmap), loops, self.ana) for ld in reads]
            out: SymInterval | None = None
            for rng in rngs:
                out = hull(self.ana, out, rng)
            box.append(None if any(r is None for r in rngs) else out)
        return box

    def _proven_lt(self, hi: Linear | None, limit: PrimExpr) -> bool:
        """Whether `hi < limit` for every value of the variables left in them."""
        if hi is None:
            return False
        top = self.ana.upper(hi.sub(self.ana.linear(limit)))  # constant, or bounded by its atoms (`x % 4`)
        return top is not None and top < 0

    def _proven_nonnegative(self, lo: Linear | None) -> bool:
        """Whether `lo >= 0` for every value of the variables left in it."""
        bottom = None if lo is None else self.ana.lower(lo)
        return bottom is not None and bottom >= 0

    def _leaf_loops(self, st: Stage, start: int, stop: int) -> Loops:
        info = self.info[st]
        return [(iv.var, info.ext[iv]) for iv in reversed(st.leaf_iter_vars[start:stop])]

    def _loops_inside(self, reader: Stage, st: Stage) -> Loops:
        """The loops that run inside `st`'s attach loop and around `reader`'s reads, innermost first."""
        parent, iv = st.attach_stage, st.attach_ivar
        assert parent is not None and iv is not None
        a = parent.leaf_iter_vars.index(iv)
        if reader is parent:
            return self._leaf_loops(parent, a + 1, len(parent.leaf_iter_vars))
        loops = self._leaf_loops(reader, 0, len(reader.leaf_iter_vars))
        x = reader
        while True:
            y, b_iv = x.attach_stage, x.attach_ivar
            if x.attach_type is not AttachType.SCOPE or y is None or b_iv is None:
                break
            b = y.leaf_iter_vars.index(b_iv)
            if y is parent:
                if b >= a:
                    return loops + self._leaf_loops(parent, a + 1, b + 1)
                break
            loops += self._leaf_loops(y, 0, b + 1)
            x = y
        raise ScheduleError(
            f"stage {st.name!r} is computed at axis {iv.name!r} of stage {parent.name!r}, but stage "
            f"{reader.name!r} reads it outside that loop; compute {reader.name!r} inside it too, or "
            f"compute {st.name!r} at the root"
        )

    def _enclosing(self, st: Stage, threads: bool = False) -> Loops:
        """Every loop around `st`'s own nest, innermost first; with `threads`, only those bound to
        threadIdx axes.

        A "shared" stage is one buffer for the whole block: it covers what all the
        block's threads read, so its region is relaxed over those thread loops too (a
        "local" one is per thread and is not).
        """
        loops: Loops = []
        x = st
        while x.attach_type is AttachType.SCOPE and x.attach_stage is not None and x.attach_ivar is not None:
            y = x.attach_stage
            for iv in reversed(y.leaf_iter_vars[:y.leaf_iter_vars.index(x.attach_ivar) + 1]):
                attr = y.iter_attrs.get(iv)
                if not threads or (attr is not None and attr.thread_tag.startswith("threadIdx")):
                    loops.append((iv.var, self.info[y].ext[iv]))
            x = y
        return loops

    def _root_values(self, st: Stage) -> dict[Var, PrimExpr]:
        info = self.info[st]
        return {iv.var: self.ana.simplify(info.rmin[iv] + info.offset[iv]) for iv in info.rmin}

    def _infer_region(self, st: Stage) -> None:
        # The loops around the attach point keep their variables in the region's ends; their ranges
        # let `(f // 4 + 56) // 64` be 0 where f is a 32-thread loop (a warp's lanes, split in two).
        # The loops it is relaxed over get their ranges too, so that a read-back index such as
        # `(w*32 + i*8 + t*2 + j) % 64 // 32` is `w` before the loops are relaxed.
        loops = self._enclosing(st)
        for reader in self.info[st].readers:
            loops += self._loops_inside(reader, st)
        with ExitStack() as ranges:
            for v, ext in dict(loops).items():
                if isinstance(ext, tx.IntImm):
                    ranges.enter_context(self.ana.bound_range(v, tx.const(0, v.dtype), ext))
            self._infer_box(st)

    def _infer_box(self, st: Stage) -> None:
        info = self.info[st]
        op = st.op
        box: list[SymInterval | None] = [None] * len(op.axis)
        unknown = [False] * len(op.axis)
        threads = self._enclosing(st, threads=True) if st.scope == "shared" else []
        for reader in info.readers:
            reads = [ld for ld in loads(self.info[reader].body) if (hit := self._stage_of_load(ld)) and hit[1] is st]
            for d, rng in enumerate(self._bounding_box(reads, len(op.axis), self._root_values(reader),
                                                       self._loops_inside(reader, st) + threads)):
                unknown[d] = unknown[d] or rng is None
                box[d] = hull(self.ana, box[d], rng)
        for d, iv in enumerate(op.axis):
            rng = box[d]
            assert iv.dom is not None
            if unknown[d] or rng is None:
                info.rmin[iv], info.rext[iv] = iv.dom.min, iv.dom.extent
            else:
                info.rmin[iv], info.rext[iv] = self.ana.expr_of(rng[0]), self._extent(rng)

    def _bounds(self, st: Stage) -> None:
        info = self.info[st]
        if st.attach_type is AttachType.SCOPE:
            self._infer_region(st)
        else:
            for iv in st.op.axis:
                assert iv.dom is not None
                info.rmin[iv], info.rext[iv] = iv.dom.min, iv.dom.extent
        for iv in st.op.reduce_axis:
            assert iv.dom is not None
            info.rmin[iv], info.rext[iv] = iv.dom.min, iv.dom.extent
        ext = info.ext
        ext.update(info.rext)
        for rel in st.relations:
            if isinstance(rel, Split):
                if rel.factor is not None:
                    ext[rel.outer], ext[rel.inner] = self._ceildiv(ext[rel.parent], rel.factor), tx.const(rel.factor)
                else:
                    assert rel.nparts is not None
                    ext[rel.outer], ext[rel.inner] = tx.const(rel.nparts), self._ceildiv(ext[rel.parent], rel.nparts)
            elif isinstance(rel, Fuse):
                ext[rel.fused] = self.ana.simplify(ext[rel.outer] * ext[rel.inner])
            else:  # a Singleton: an axis of extent 1 over nothing
                ext[rel.iv] = tx.const(1)
        off = info.offset
        off.update({iv: iv.var for iv in st.leaf_iter_vars})
        for rel in reversed(st.relations):
            if isinstance(rel, Split):
                off[rel.parent] = self.ana.simplify(off[rel.outer] * ext[rel.inner] + off[rel.inner])
            elif isinstance(rel, Fuse):
                inner_ext = ext[rel.inner]
                if isinstance(inner_ext, tx.IntImm) and inner_ext.value == 1:
                    off[rel.outer], off[rel.inner] = off[rel.fused], tx.const(0)
                else:
                    off[rel.outer], off[rel.inner] = off[rel.fused] // inner_ext, off[rel.fused] % inner_ext
        if info.buffer is None:
            shape = [info.rext[iv] for iv in st.op.axis]
            if st.row_align is not None:
                shape[-1] = self._aligned(st, shape[-1], *st.row_align)
            info.buffer = tir_buffer(st.name, shape, st.op.dtype, st.scope)

    def _aligned(self, st: Stage, extent: PrimExpr, factor: int, offset: int) -> PrimExpr:
        """`extent` raised to the next value = `offset` (mod `factor`) (`Stage.storage_align`)."""
        extent = self.ana.simplify(extent)
        if not isinstance(extent, tx.IntImm):
            raise ScheduleError(f"storage_align on stage {st.name!r}: the row's extent {extent} is not a constant")
        return tx.const(extent.value + (offset - extent.value) % factor)

    def _guards(self, st: Stage) -> list[PrimExpr]:
        """The conditions under which a leaf iteration is inside the stage's region and the tensor."""
        info = self.info[st]
        own = self._leaf_loops(st, 0, len(st.leaf_iter_vars))
        outer = self._enclosing(st) if st.attach_type is AttachType.SCOPE else []
        conds: list[PrimExpr] = []
        for iv in [*st.op.axis, *st.op.reduce_axis]:
            offset = self.ana.simplify(info.offset[iv])
            rng = relax(offset, own, self.ana)
            if not self._proven_lt(None if rng is None else rng[1], info.rext[iv]):
                conds.append(offset < info.rext[iv])
            if outer and iv.kind is IterKind.DATA_PAR:
                assert iv.dom is not None
                value = self.ana.simplify(info.rmin[iv] + offset)
                rng = relax(value, own + outer, self.ana)
                if not self._proven_lt(None if rng is None else rng[1], iv.dom.extent):
                    conds.append(value < iv.dom.extent)
                if not self._proven_nonnegative(None if rng is None else rng[0]):
                    conds.append(value >= 0)
        return conds

    # -- 4: loop nests ------------------------------------------------------------------
    def _rewrite_loads(self, e: PrimExpr) -> PrimExpr:
        def pre(x: PrimExpr) -> PrimExpr | None:
            hit = self._stage_of_load(x)
            if hit is None:
                return None
            assert isinstance(x, BufferLoad)
            t, producer = hit
            indices = [transform(i, pre) for i in x.indices]
            if producer is None:
                return self.placeholder_bufs[id(t.op)].load(*indices)
            info = self.info[producer]
            assert info.buffer is not None
            shifted = [self.ana.simplify(i - info.rmin[iv]) for i, iv in zip(indices, producer.op.axis, strict=True)]
            return info.buffer.load(*shifted)

        return transform(e, pre)

    def _prefetches(self, st: Stage, body: PrimExpr) -> dict[IterVar, list[Stmt]]:
        """Per axis, the prefetch loops `Stage.prefetch` asked for: one `prefetch` per cache line of the
        bounding box that `body` reads from the tensor in iteration `iv + offset`."""
        out: dict[IterVar, list[Stmt]] = {}
        for tensor, iv, offset in st.prefetches:
            where = f"prefetch of {tensor.name!r} at axis {iv.name!r} of stage {st.name!r}"
            if not any(x is iv for x in st.leaf_iter_vars):
                raise ScheduleError(f"{where}: the axis is no longer a leaf (it was split or fused afterwards)")
            attr = st.iter_attrs.get(iv)
            if attr is not None and attr.kind is ForKind.VECTORIZED:
                raise ScheduleError(f"{where}: the axis is vectorized; prefetch at a loop outside it")
            producer = self.sch.stage_of(tensor)
            buf = self.placeholder_bufs.get(id(tensor.op)) if producer is None else self.info[producer].buffer
            reads = [ld for ld in loads(body) if buf is not None and ld.buffer is buf]
            if buf is None or not reads:
                raise ScheduleError(f"{where}: the stage does not read the tensor after inlining")
            inner = self._leaf_loops(st, st.leaf_iter_vars.index(iv) + 1, len(st.leaf_iter_vars))
            box: list[SymInterval] = []
            for d, rng in enumerate(self._bounding_box(reads, buf.ndim, {iv.var: iv.var + offset}, inner)):
                if rng is None:
                    raise ScheduleError(f"{where}: its index along axis {d} is not affine in the loops")
                box.append(rng)
            per_line = max(1, _CACHE_LINE * 8 // DataType.of(buf.dtype).bits)
            ks = [Var(f"pf{d}") for d in range(buf.ndim)]
            index = [self.ana.simplify(self.ana.expr_of(lo) + k) for (lo, _), k in zip(box[:-1], ks, strict=False)]
            index.append(self.ana.simplify(self.ana.expr_of(box[-1][0]) + ks[-1] * per_line))
            stmt: Stmt = Evaluate(tx.call("prefetch", buf.load(*index)))
            stmt = For(ks[-1], tx.const(0), self._ceildiv(self._extent(box[-1]), per_line),
                       ForKind.SERIAL, stmt)
            for d in reversed(range(buf.ndim - 1)):
                stmt = For(ks[d], tx.const(0), self._extent(box[d]), ForKind.SERIAL, stmt)
            out.setdefault(iv, []).append(stmt)
        return out

    def _nest(
        self, st: Stage, loops: list[tuple[IterVar, Var]], inner: Stmt, conds: list[PrimExpr], attach: bool,
        prefetch: dict[IterVar, list[Stmt]] | None = None,
    ) -> Stmt:
        info = self.info[st]
        pos = {id(v): n for n, (_, v) in enumerate(loops)}
        at_level: dict[int, list[PrimExpr]] = {}
        for c in conds:
            level = max((pos[id(v)] for v in free_vars(c) if id(v) in pos), default=-1)
            at_level.setdefault(level, []).append(c)
        stmt = inner
        for n in reversed(range(len(loops))):
            iv, v = loops[n]
            attr = st.iter_attrs.get(iv) or IterAttr()
            # Under a GPU thread loop the guard leaves out what is attached there: those stages are
            # the block's work (shared tiles filled by every thread between barriers), and bound
            # their own regions; a thread past the edge of the output must still take part.
            threads = attr.kind is ForKind.THREAD_BINDING
            if n in at_level and threads:
                stmt = IfThenElse(_conj(at_level[n]), stmt)
            if attach:
                for child in reversed(info.children.get(iv, [])):
                    child_buf = self.info[child].buffer
                    assert child_buf is not None
                    stmt = Allocate(child_buf, seq(self._emit(child), stmt))
            if n in at_level and not threads:
                stmt = IfThenElse(_conj(at_level[n]), stmt)
            if prefetch and iv in prefetch:
                stmt = seq(*prefetch[iv], stmt)
            stmt = For(v, tx.const(0), info.ext[iv], attr.kind, stmt, attr.thread_tag, dict(attr.pragmas))
        if -1 in at_level:
            stmt = IfThenElse(_conj(at_level[-1]), stmt)
        return stmt

    def _emit(self, st: Stage) -> Stmt:
        info = self.info[st]
        buf = info.buffer
        assert buf is not None
        leaves = st.leaf_iter_vars
        index = [self.ana.simplify(info.offset[iv]) for iv in st.op.axis]
        body = self._rewrite_loads(substitute(info.body, self._root_values(st)))
        conds = self._guards(st)
        pf = self._prefetches(st, body)
        if not isinstance(body, Reduce):
            loops = [(iv, iv.var) for iv in leaves]
            return self._nest(st, loops, BufferStore(buf, body, index), conds, attach=True, prefetch=pf)
        first = next(n for n, iv in enumerate(leaves) if iv.kind is IterKind.REDUCE)
        if any((a := st.iter_attrs.get(iv)) is not None and a.kind is ForKind.THREAD_BINDING for iv in leaves[first:]
               if iv.kind is IterKind.REDUCE):
            return self._emit_across_threads(st, body, index, conds, first)
        rest_vars = {id(iv.var) for iv in leaves[first:]}
        reduce_vars = {id(iv.var) for iv in leaves if iv.kind is IterKind.REDUCE}
        common_conds = [c for c in conds if not any(id(v) in rest_vars for v in free_vars(c))]
        rest_conds = [c for c in conds if any(id(v) in rest_vars for v in free_vars(c))]
        init_axes = [iv for iv in leaves[first:] if iv.kind is not IterKind.REDUCE]
        fresh: dict[Var, Var] = {iv.var: Var(iv.var.name, iv.var.dtype) for iv in init_axes}
        init_loops = [(iv, fresh[iv.var]) for iv in init_axes]
        init_conds = [substitute(c, fresh) for c in rest_conds if not any(id(v) in reduce_vars for v in free_vars(c))]
        init = BufferStore(buf, body.combiner.identity(body.dtype), [substitute(i, fresh) for i in index])
        update: Stmt = BufferStore(buf, body.combiner.combine(buf.load(*index), body.source), index)
        if not (isinstance(body.condition, tx.IntImm) and body.condition.value):
            update = IfThenElse(body.condition, update)
        init_nest = self._nest(st, init_loops, init, init_conds, attach=False)
        update_nest = self._nest(
            st, [(iv, iv.var) for iv in leaves[first:]], update, rest_conds, attach=True, prefetch=pf
        )
        common = [(iv, iv.var) for iv in leaves[:first]]
        return self._nest(st, common, seq(init_nest, update_nest), common_conds, attach=True, prefetch=pf)

    def _emit_across_threads(self, st: Stage, body: Reduce, index: list[PrimExpr], conds: list[PrimExpr],
                             first: int) -> Stmt:
        """A reduction with an axis bound to threadIdx.x (`Stage.bind`): per thread, the identity in a
        register, its part of the reduction accumulated there (the other reduction loops, serial, guarded),
        then `kiln.warp_allreduce` across the bound threads, and the result stored: by every thread into
        a "local" buffer (each thread then holds the value), by the first thread elsewhere.

        The bound loop is the outermost of the reduction's: its iterations run at once, whatever its
        place among the leaves (a reduction's order does not matter).
        """
        leaves = st.leaf_iter_vars
        where = f"stage {st.name!r}: a reduction across threads"
        if any(iv.kind is not IterKind.REDUCE for iv in leaves[first:]):
            raise ScheduleError(f"{where} needs its data axes outside its reduction axes "
                                f"(leaf axes: {', '.join(iv.name for iv in leaves)}); reorder")
        bound = [iv for iv in leaves[first:] if (a := st.iter_attrs.get(iv)) and a.kind is ForKind.THREAD_BINDING]
        if len(bound) > 1:
            raise ScheduleError(f"{where} binds one reduction axis to threadIdx.x, got "
                                f"{', '.join(iv.name for iv in bound)}")
        (thread,) = bound
        threads = self.info[st].ext[thread]
        if not isinstance(threads, tx.IntImm):
            raise ScheduleError(f"{where}: axis {thread.name!r} has extent {threads}; split by a constant first")
        serial = [(iv, iv.var) for iv in leaves[first:] if iv is not thread]
        rest_vars = {id(iv.var) for iv in leaves[first:]}
        common_conds = [c for c in conds if not any(id(v) in rest_vars for v in free_vars(c))]
        rest_conds = [c for c in conds if any(id(v) in rest_vars for v in free_vars(c))]
        buf = self.info[st].buffer
        assert buf is not None
        acc = tir_buffer(f"{st.name}_acc", [1], body.dtype, "local")
        update: Stmt = BufferStore(acc, body.combiner.combine(acc.load(0), body.source), [0])
        if not (isinstance(body.condition, tx.IntImm) and body.condition.value):
            update = IfThenElse(body.condition, update)
        # the guards of the serial loops, and those of the thread alone, stay around the update: every thread
        # takes part in the all-reduce
        store: Stmt = BufferStore(buf, acc.load(0), index)
        if buf.scope != "local":
            store = IfThenElse(tx.eq(thread.var, 0), store)
        per_thread = Allocate(acc, seq(
            BufferStore(acc, body.combiner.identity(body.dtype), [0]),
            self._nest(st, serial, update, rest_conds, attach=True),
            allreduce(acc.load(0), body.combiner.combine, int(threads.value)),
            store,
        ))
        across = self._nest(st, [(thread, thread.var)], per_thread, [], attach=True)
        return self._nest(st, [(iv, iv.var) for iv in leaves[:first]], across, common_conds, attach=True)

    def run(self) -> PrimFunc:
        live = self._prepare()
        for st in reversed(live):
            self._bounds(st)
        roots = [st for st in live if st.attach_type is AttachType.ROOT]
        body = seq(*[self._emit(st) for st in roots])
        for st in reversed(roots):
            buf = self.info[st].buffer
            if st not in self.arg_stages and buf is not None:
                body = Allocate(buf, body)
        # A value several readers share is one node with several parents: bind it once (a let), so
        # no later walk of the loop IR unfolds the DAG into a tree exponential in its depth.
        return PrimFunc(self.name, self.params, bind_shared(body))


def lower(sch: Schedule, args: Sequence[Tensor], name: str = "main") -> PrimFunc:
    """Lowers a schedule to loop IR.

    Args:
        sch: the schedule (`te.create_schedule`).
        args: the tensors that become the function's buffer parameters, in
            order: every placeholder read and every output of the schedule.
        name: the function's name.

    Returns:
        The `tir.PrimFunc`.

    Raises:
        ScheduleError: for args that do not cover the inputs and outputs, and
            placements that cannot be honoured (a stage read outside the loop it
            is computed at, an output inlined or attached).
    """
    if not isinstance(sch, Schedule):
        raise ScheduleError(f"lower {name!r}: expected a Schedule, got {sch!r}")
    return _Lowering(sch, args, name).run()


__all__ = ["lower"]
