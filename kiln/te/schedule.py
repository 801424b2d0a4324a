"""Schedules: how each compute stage's loops are split, ordered, run and placed.

`create_schedule(outputs)` gives a `Schedule` with one `Stage` per compute
operation (producers first). A stage keeps its root axes (the op's `axis` and
`reduce_axis`), the relations that derive new axes from them (`Split`,
`Fuse`), the current order of its leaf axes, per-axis loop kinds and
pragmas, and where it is computed (at the root, inline, or inside a loop of
a consumer stage). `kiln.te.lower` turns all of that into loop IR.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any

import attrs

from kiln.ir import graph
from kiln.te.arith import loads, transform
from kiln.te.tensor import (
    ComputeOp,
    IterKind,
    IterVar,
    Operation,
    PlaceholderOp,
    TEError,
    Tensor,
    TensorBuffer,
    compute,
    iter_var,
)
from kiln.tir import expr as tx
from kiln.tir.expr import BufferLoad, PrimExpr
from kiln.tir.stmt import ForKind


class ScheduleError(TEError):
    """A schedule primitive applied where it cannot be (unknown axis, wrong stage, ...)."""


class AttachType(enum.Enum):
    """Where a stage's loop nest goes."""

    ROOT = "root"  # its own nest at the top of the function
    INLINE = "inline"  # substituted into its consumers
    SCOPE = "scope"  # inside a loop of another stage (compute_at)


@attrs.frozen(eq=False)
class Split:
    """`parent` = `outer * factor + inner` (`factor` or `nparts` given, the other inferred)."""

    parent: IterVar
    outer: IterVar
    inner: IterVar
    factor: int | None
    nparts: int | None


@attrs.frozen(eq=False)
class Fuse:
    """`fused` = `outer * extent(inner) + inner`."""

    outer: IterVar
    inner: IterVar
    fused: IterVar


@attrs.frozen(eq=False)
class Singleton:
    """`iv` is a new axis of extent 1 over nothing: what `fuse()` of no axes makes, so that a 0-d
    stage has a loop to bind (TVM's Singleton relation)."""

    iv: IterVar


@attrs.define(eq=False)
class IterAttr:
    """How one leaf axis's loop runs."""

    kind: ForKind = ForKind.SERIAL
    thread_tag: str = ""
    pragmas: dict[str, Any] = attrs.field(factory=dict)


class Stage:
    """The schedule of one compute operation."""

    def __init__(self, op: ComputeOp, schedule: Schedule) -> None:
        self.op = op
        self.origin_op: Operation = op
        self.schedule = schedule
        self.relations: list[Split | Fuse | Singleton] = []
        self.leaf_iter_vars: list[IterVar] = [*op.axis, *op.reduce_axis]
        self.all_iter_vars: list[IterVar] = list(self.leaf_iter_vars)
        self.iter_attrs: dict[IterVar, IterAttr] = {}
        self.attach_type = AttachType.ROOT
        self.attach_stage: Stage | None = None
        self.attach_ivar: IterVar | None = None
        self.scope = "global"
        self.is_output = False
        self.prefetches: list[tuple[Tensor, IterVar, int]] = []
        self.row_align: tuple[int, int] | None = None  # (factor, offset) of the last dim's allocated extent

    @property
    def name(self) -> str:
        """The operation's name."""
        return self.op.name

    def __repr__(self) -> str:
        return f"stage({self.name}, leaves=[{', '.join(iv.name for iv in self.leaf_iter_vars)}])"

    # -- helpers ---------------------------------------------------------------------
    def _leaf_index(self, iv: IterVar, primitive: str) -> int:
        if not isinstance(iv, IterVar):
            raise ScheduleError(f"{primitive} on stage {self.name!r}: expected an IterVar axis, got {iv!r}")
        for n, leaf in enumerate(self.leaf_iter_vars):
            if leaf is iv:
                return n
        if any(iv is x for x in self.all_iter_vars):
            where = "was already split or fused away"
        elif (
            self.origin_op is not self.op
            and isinstance(self.origin_op, ComputeOp)
            and any(iv is x for x in (*self.origin_op.axis, *self.origin_op.reduce_axis))
        ):
            where = "belongs to the op that a cache_read/cache_write replaced; take axes from s[tensor].op"
        else:
            where = "is not an axis of this stage"
        leaves = ", ".join(x.name for x in self.leaf_iter_vars)
        raise ScheduleError(f"{primitive} on stage {self.name!r}: axis {iv.name!r} {where} (leaf axes: {leaves})")

    def _new_iv(self, name: str, kind: IterKind) -> IterVar:
        iv = iter_var(name, None, kind)
        self.all_iter_vars.append(iv)
        return iv

    def _attr(self, iv: IterVar) -> IterAttr:
        return self.iter_attrs.setdefault(iv, IterAttr())

    def _no_reduce(self, iv: IterVar, primitive: str) -> None:
        if iv.kind is IterKind.REDUCE:
            raise ScheduleError(
                f"{primitive} on stage {self.name!r}: axis {iv.name!r} is a reduction axis; its iterations "
                "accumulate into the same element and cannot run concurrently"
            )

    # -- loop structure --------------------------------------------------------------
    def split(self, parent: IterVar, factor: int | None = None, nparts: int | None = None) -> tuple[IterVar, IterVar]:
        """Splits `parent` into `(outer, inner)` with `inner` of extent `factor` (or `outer` of `nparts`).

        A factor that does not divide the extent leaves a tail, guarded in the loop IR.
        """
        n = self._leaf_index(parent, "split")
        if (factor is None) == (nparts is None):
            raise ScheduleError(
                f"split on stage {self.name!r}, axis {parent.name!r}: give exactly one of factor, nparts"
            )
        amount = factor if factor is not None else nparts
        if isinstance(amount, tx.IntImm):
            amount = amount.value
        if not isinstance(amount, int) or isinstance(amount, bool) or amount <= 0:
            raise ScheduleError(
                f"split on stage {self.name!r}, axis {parent.name!r}: "
                f"factor/nparts must be a positive int, got {amount!r}"
            )
        outer = self._new_iv(f"{parent.name}_outer", parent.kind)
        inner = self._new_iv(f"{parent.name}_inner", parent.kind)
        fac, parts = (amount, None) if factor is not None else (None, amount)
        self.relations.append(Split(parent, outer, inner, fac, parts))
        self.leaf_iter_vars[n : n + 1] = [outer, inner]
        return outer, inner

    def tile(
        self, x_parent: IterVar, y_parent: IterVar, x_factor: int, y_factor: int
    ) -> tuple[IterVar, IterVar, IterVar, IterVar]:
        """Splits two axes and orders the result `(x_outer, y_outer, x_inner, y_inner)`."""
        xo, xi = self.split(x_parent, x_factor)
        yo, yi = self.split(y_parent, y_factor)
        self.reorder(xo, yo, xi, yi)
        return xo, yo, xi, yi

    def reorder(self, *axes: IterVar) -> None:
        """Puts `axes` in this order, in the positions they occupy among the leaf axes."""
        idx = [self._leaf_index(iv, "reorder") for iv in axes]
        if len(set(idx)) != len(idx):
            raise ScheduleError(f"reorder on stage {self.name!r}: an axis is given twice ({[iv.name for iv in axes]})")
        for pos, iv in zip(sorted(idx), axes, strict=True):
            self.leaf_iter_vars[pos] = iv

    def fuse(self, *axes: IterVar) -> IterVar:
        """Fuses adjacent leaf axes (outermost first) into one axis.

        With no axes, a new outermost axis of extent 1 (a 0-d stage's only axis, for `bind`).
        """
        if not axes:
            single = self._new_iv("singleton", IterKind.DATA_PAR)
            self.relations.append(Singleton(single))
            self.leaf_iter_vars.insert(0, single)
            return single
        idx = [self._leaf_index(iv, "fuse") for iv in axes]
        if idx != list(range(idx[0], idx[0] + len(idx))):
            names = ", ".join(iv.name for iv in axes)
            raise ScheduleError(
                f"fuse on stage {self.name!r}: axes {names} must be adjacent leaf axes, outermost first; reorder first"
            )
        kinds = {iv.kind for iv in axes}
        if len(kinds) > 1:
            raise ScheduleError(f"fuse on stage {self.name!r}: cannot fuse reduction and data axes together")
        fused = axes[0]
        for iv in axes[1:]:
            new = self._new_iv(f"{fused.name}_{iv.name}_fused".replace("_fused_", "_"), iv.kind)
            self.relations.append(Fuse(fused, iv, new))
            fused = new
        self.leaf_iter_vars[idx[0] : idx[-1] + 1] = [fused]
        return fused

    # -- loop kinds ------------------------------------------------------------------
    def _set_kind(self, iv: IterVar, kind: ForKind, primitive: str, tag: str = "") -> None:
        self._leaf_index(iv, primitive)
        attr = self._attr(iv)
        if attr.kind not in (ForKind.SERIAL, kind):
            raise ScheduleError(f"{primitive} on stage {self.name!r}: axis {iv.name!r} is already {attr.kind.value}")
        attr.kind, attr.thread_tag = kind, tag

    def vectorize(self, iv: IterVar) -> None:
        """Runs the loop of `iv` as SIMD lanes."""
        self._no_reduce(iv, "vectorize")
        self._set_kind(iv, ForKind.VECTORIZED, "vectorize")

    def parallel(self, iv: IterVar) -> None:
        """Runs the iterations of `iv` across CPU cores."""
        self._no_reduce(iv, "parallel")
        self._set_kind(iv, ForKind.PARALLEL, "parallel")

    def unroll(self, iv: IterVar) -> None:
        """Repeats the body of `iv`'s loop once per iteration."""
        self._set_kind(iv, ForKind.UNROLLED, "unroll")

    def bind(self, iv: IterVar, thread_ivar: IterVar) -> None:
        """Binds the loop of `iv` to a GPU thread axis made by `te.thread_axis`.

        A reduction axis (split first: its inner part) may be bound to threadIdx.x: a cross-thread
        reduction. Each thread accumulates its part, then the threads combine their results (an
        all-reduce, `kiln.tir.allreduce`), and every one of them holds the stage's value. Only
        threadIdx.x: its consecutive threads are the lanes of a warp, which the all-reduce
        combines with shuffles. The stage's data axes must stay outside its reduction axes.
        """
        if not isinstance(thread_ivar, IterVar) or thread_ivar.kind is not IterKind.THREAD:
            raise ScheduleError(f"bind on stage {self.name!r}: expected a te.thread_axis, got {thread_ivar!r}")
        if iv.kind is IterKind.REDUCE and thread_ivar.thread_tag != "threadIdx.x":
            raise ScheduleError(
                f"bind on stage {self.name!r}: reduction axis {iv.name!r} can be bound to threadIdx.x only "
                f"(a cross-thread reduction over the lanes of warps), not {thread_ivar.thread_tag}"
            )
        self._set_kind(iv, ForKind.THREAD_BINDING, "bind", thread_ivar.thread_tag)

    def pragma(self, iv: IterVar, key: str, value: Any = None) -> None:
        """Annotates the loop of `iv` with `key = value` (For.annotations)."""
        self._leaf_index(iv, "pragma")
        self._attr(iv).pragmas[key] = value

    def prefetch(self, tensor: Tensor, iv: IterVar, offset: int = 1) -> None:
        """At the start of each iteration of `iv`, prefetches into cache the part of `tensor` that
        iteration `iv + offset` reads (TVM's `prefetch`): for streaming loops whose compute is too
        long for the out-of-order window to keep enough cache misses in flight."""
        self._leaf_index(iv, "prefetch")
        if not isinstance(tensor, Tensor):
            raise ScheduleError(f"prefetch on stage {self.name!r}: expected a Tensor, got {tensor!r}")
        if not any(isinstance(ld.buffer, TensorBuffer) and ld.buffer.tensor is tensor for ld in loads(self.op.body)):
            raise ScheduleError(f"prefetch on stage {self.name!r}: the stage does not read tensor {tensor.name!r}")
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 1:
            raise ScheduleError(f"prefetch on stage {self.name!r}: offset must be an int >= 1, got {offset!r}")
        self.prefetches.append((tensor, iv, offset))

    # -- placement -------------------------------------------------------------------
    def compute_at(self, parent: Stage, iv: IterVar) -> None:
        """Computes this stage inside the loop of `iv` of `parent`, only the region that loop needs."""
        if not isinstance(parent, Stage):
            raise ScheduleError(f"compute_at on stage {self.name!r}: expected a Stage (s[tensor]), got {parent!r}")
        parent._leaf_index(iv, f"compute_at of {self.name!r} into")
        if parent is self:
            raise ScheduleError(f"compute_at on stage {self.name!r}: cannot attach a stage to itself")
        if not self.schedule._reads_transitively(parent, self):
            raise ScheduleError(
                f"compute_at on stage {self.name!r}: stage {parent.name!r} does not consume {self.name!r}"
            )
        self.attach_type, self.attach_stage, self.attach_ivar = AttachType.SCOPE, parent, iv

    def compute_inline(self) -> None:
        """Substitutes this stage's expression into its consumers instead of storing it."""
        if self.op.reduce_axis:
            raise ScheduleError(f"compute_inline on stage {self.name!r}: a reduction cannot be inlined")
        if self.is_output:
            raise ScheduleError(f"compute_inline on stage {self.name!r}: an output of the schedule cannot be inlined")
        self.attach_type, self.attach_stage, self.attach_ivar = AttachType.INLINE, None, None

    def compute_root(self) -> None:
        """Computes this stage in its own loop nest at the top level (the default)."""
        self.attach_type, self.attach_stage, self.attach_ivar = AttachType.ROOT, None, None

    def set_scope(self, scope: str) -> None:
        """The storage scope of this stage's temporary ("global", "local", "shared")."""
        self.scope = scope

    def storage_align(self, iv: IterVar, factor: int, offset: int) -> None:
        """Pads the stride of axis `iv` to the smallest value = `offset` (mod `factor`), as TVM's
        storage_align: rows of a shared tile `factor + offset` elements apart fall in other memory banks.

        Only the row stride of a temporary is padded here, so `iv` is the operation's second-to-last
        axis; the last axis's allocated extent grows to that stride and the padding is never read.
        """
        if len(self.op.axis) < 2 or iv is not self.op.axis[-2]:
            raise ScheduleError(f"storage_align on stage {self.name!r}: {iv.name!r} is not the second-to-last "
                                "axis of the operation (only a row stride can be padded)")
        if self.is_output:
            raise ScheduleError(f"storage_align on stage {self.name!r}: an output's layout is the caller's")
        if not (isinstance(factor, int) and isinstance(offset, int) and factor > 0 and 0 <= offset < factor):
            raise ScheduleError(f"storage_align on stage {self.name!r}: needs 0 <= offset < factor, "
                                f"got factor={factor!r}, offset={offset!r}")
        self.row_align = (factor, offset)


class Schedule:
    """The stages of a set of output tensors, producers first."""

    def __init__(self, outputs: Sequence[Tensor]) -> None:
        self.outputs = list(outputs)
        self.stages: list[Stage] = []
        self._by_op: dict[int, Stage] = {}
        self._ops: list[Operation] = []  # keeps every op mapped in `_by_op` alive, so ids stay unique
        for op in _post_order([t.op for t in self.outputs]):
            if isinstance(op, ComputeOp):
                self._add(Stage(op, self), len(self.stages))
        for t in self.outputs:
            if isinstance(t.op, PlaceholderOp):
                raise ScheduleError(f"create_schedule: output {t.name!r} is a placeholder, not a computed tensor")
            self[t].is_output = True

    def _add(self, stage: Stage, pos: int) -> None:
        self.stages.insert(pos, stage)
        self._by_op[id(stage.op)] = stage
        self._ops.append(stage.op)

    def __getitem__(self, key: Tensor | Operation) -> Stage:
        op = key.op if isinstance(key, Tensor) else key
        stage = self._by_op.get(id(op))
        if stage is None:
            what = "a placeholder (it has no stage)" if isinstance(op, PlaceholderOp) else "not in this schedule"
            raise ScheduleError(f"tensor {op.name!r} is {what}")
        return stage

    def stage_of(self, t: Tensor) -> Stage | None:
        """The stage computing `t`, None for placeholders."""
        return self._by_op.get(id(t.op))

    def _reads_transitively(self, consumer: Stage, producer: Stage) -> bool:
        targets = {id(producer.op), id(producer.origin_op)}
        stack: list[Operation] = [consumer.op]
        seen: set[int] = set()
        while stack:
            op = stack.pop()
            for t in op.input_tensors:
                if id(t.op) in targets:
                    return True
                stage = self.stage_of(t)
                nxt = stage.op if stage is not None else t.op
                if id(nxt) not in seen:
                    seen.add(id(nxt))
                    stack.append(nxt)
        return False

    def _replace_op(self, stage: Stage, op: ComputeOp) -> None:
        self._by_op[id(op)] = stage
        self._ops.append(op)
        stage.op = op

    def cache_read(self, tensor: Tensor, scope: str, readers: Sequence[Tensor | Stage],
                   axes: Sequence[int] | None = None) -> Tensor:
        """A copy of `tensor` in `scope` that `readers` read instead of `tensor`.

        Args:
            tensor: the tensor to copy.
            scope: "shared", "local" or "global".
            readers: the stages (or their tensors) that read the copy.
            axes: the copy's layout, a permutation of `tensor`'s axes (as numpy.transpose):
                `(1, 0)` keeps a (N, K) tensor as (K, N), so that the threads reading one k
                read neighbouring addresses. None keeps `tensor`'s layout.

        Returns:
            The cache tensor; its stage can be placed with `compute_at`.
        """
        name = f"{tensor.name}_{scope}"
        ndim = len(tensor.shape)
        perm = list(range(ndim)) if axes is None else [int(a) for a in axes]
        if sorted(perm) != list(range(ndim)):
            raise ScheduleError(f"cache_read of {tensor.name!r}: axes {tuple(perm)} is not a permutation of "
                                f"its {ndim} axes")
        inverse = [perm.index(d) for d in range(ndim)]
        cache = compute([tensor.shape[a] for a in perm],
                        lambda *i: tensor[tuple(i[inverse[d]] for d in range(ndim))], name=name)
        reader_stages = [r if isinstance(r, Stage) else self[r] for r in readers]
        if not reader_stages:
            raise ScheduleError(f"cache_read of {tensor.name!r}: no readers given")
        for r in reader_stages:
            if not any(t is tensor or t.op is tensor.op for t in r.op.input_tensors):
                raise ScheduleError(f"cache_read of {tensor.name!r}: stage {r.name!r} does not read it")
            body = _replace_tensor(r.op.body, tensor, cache, perm)
            self._replace_op(r, ComputeOp(r.op.name, r.op.axis, r.op.reduce_axis, body, r.op.tag, r.op.attrs))
        src = self.stage_of(tensor)
        pos = self.stages.index(src) + 1 if src is not None else min(self.stages.index(r) for r in reader_stages)
        stage = Stage(_as_compute(cache.op), self)
        stage.scope = scope
        self._add(stage, pos)
        return cache

    def cache_write(self, tensor: Tensor, scope: str) -> Tensor:
        """Computes `tensor` into a buffer in `scope` first, then copies it out.

        The cache stage takes over the original axes (reduction axes included);
        `tensor`'s stage becomes a copy with fresh axes. Call it before
        scheduling `tensor`'s stage.

        Returns:
            The cache tensor.
        """
        stage = self[tensor]
        if stage.relations or stage.iter_attrs or stage.attach_type is not AttachType.ROOT:
            raise ScheduleError(f"cache_write of {tensor.name!r}: call it before scheduling stage {stage.name!r}")
        old = stage.op
        cache_op = ComputeOp(f"{old.name}_{scope}", old.axis, old.reduce_axis, old.body, old.tag, old.attrs)
        cache = cache_op.output()
        fresh = [iter_var(iv.name, iv.dom, IterKind.DATA_PAR) for iv in old.axis]
        copy = ComputeOp(old.name, fresh, (), cache[tuple(iv.var for iv in fresh)], old.tag, old.attrs)
        self._replace_op(stage, copy)
        stage.leaf_iter_vars = list(fresh)
        stage.all_iter_vars = list(fresh)
        cache_stage = Stage(cache_op, self)
        cache_stage.scope = scope
        self._add(cache_stage, self.stages.index(stage))
        return cache


def _as_compute(op: Operation) -> ComputeOp:
    assert isinstance(op, ComputeOp)  # compute() always makes one
    return op


def _replace_tensor(body: PrimExpr, old: Tensor, new: Tensor, perm: Sequence[int] | None = None) -> PrimExpr:
    """`body` reading `new` where it read `old`; `new`'s axis d is `old`'s axis `perm[d]`."""
    def pre(e: PrimExpr) -> PrimExpr | None:
        if isinstance(e, BufferLoad) and isinstance(e.buffer, TensorBuffer) and e.buffer.tensor is not None:
            t = e.buffer.tensor
            if t is old or t.op is old.op:
                indices = [transform(i, pre) for i in e.indices]
                return new[tuple(indices[a] for a in perm) if perm is not None else tuple(indices)]
        return None

    return transform(body, pre)


def _post_order(roots: Sequence[Operation]) -> list[Operation]:
    """Operations reachable from `roots`, each after everything it reads."""
    return graph.post_order(roots, lambda op: [t.op for t in op.input_tensors])


def create_schedule(outputs: Tensor | Sequence[Tensor]) -> Schedule:
    """A schedule computing `outputs` with every stage at the root, loops in axis order."""
    outs = [outputs] if isinstance(outputs, Tensor) else list(outputs)
    for t in outs:
        if not isinstance(t, Tensor):
            raise ScheduleError(f"create_schedule: expected tensors, got {t!r}")
    return Schedule(outs)


__all__ = ["AttachType", "Fuse", "IterAttr", "Schedule", "ScheduleError", "Singleton", "Split", "Stage",
           "create_schedule"]
