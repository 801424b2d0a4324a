"""Tensors and the operations that produce them: `placeholder`, `compute`, `reduce_axis`.

A `Tensor` is the output of an `Operation`: a `PlaceholderOp` (an input the
caller passes) or a `ComputeOp` (one scalar expression per output element,
written as a Python lambda over the axis variables). Indexing a tensor,
`A[i, j]`, gives a loop-IR load from the tensor's `TensorBuffer`, a `Buffer`
that remembers its tensor; lowering later swaps it for the real buffer.
"""

from __future__ import annotations

import contextlib
import contextvars
import enum
import inspect
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import attrs

from kiln.errors import KilnError
from kiln.ir.types import SumDim, SymDim
from kiln.tir import expr as tx
from kiln.tir.dims import dim_expr
from kiln.tir.expr import Buffer, BufferLoad, ExprLike, PrimExpr, Var, as_expr


class TEError(KilnError, ValueError):
    """A tensor expression or schedule that cannot mean anything (a bad shape, axis or primitive)."""


class IterKind(enum.Enum):
    """What an iteration variable ranges over."""

    DATA_PAR = "data_par"  # an output axis
    REDUCE = "reduce"  # a reduction axis
    THREAD = "thread"  # a GPU thread axis (`thread_axis`)


@attrs.frozen(eq=False, repr=False)
class Range:
    """The half-open range `[min, min + extent)`."""

    min: PrimExpr
    extent: PrimExpr

    def __repr__(self) -> str:
        return f"Range({self.min}, {self.extent})"


@attrs.frozen(eq=False, repr=False)
class IterVar(Var):
    """An iteration variable: a `Var` with its domain (None until lowering infers it) and its kind.

    It is the loop variable itself, so an axis takes part in index arithmetic
    directly (`A[i + k, j]` with `k` a reduction axis).
    """

    dom: Range | None = None
    kind: IterKind = IterKind.DATA_PAR
    thread_tag: str = ""

    @property
    def var(self) -> Var:
        """The loop variable (the IterVar itself)."""
        return self

    def __repr__(self) -> str:
        dom = f", {self.dom}" if self.dom is not None else ""
        return f"IterVar({self.name}{dom}, {self.kind.value})"


def iter_var(name: str, dom: Range | None, kind: IterKind, thread_tag: str = "") -> IterVar:
    """A fresh int32 IterVar."""
    return IterVar(name, "int32", dom=dom, kind=kind, thread_tag=thread_tag)


IndexLike = ExprLike
DimLike = ExprLike | SymDim | SumDim  # a dim of a shape: a symbolic dim of a relay type too, in a `size_vars` scope


def as_index(value: DimLike) -> PrimExpr:
    """`value` as an expression (Python ints become int32 immediates; a symbolic dim of a type, `2*n`, the
    product of its size variables in the current `size_vars` scope)."""
    if isinstance(value, (SymDim, SumDim)):
        return symbolic_dim(value)
    return as_expr(value)


_SIZE_VARS: contextvars.ContextVar[dict[str, Var] | None] = contextvars.ContextVar("size_vars", default=None)


@contextlib.contextmanager
def size_vars() -> Iterator[dict[str, Var]]:
    """A scope in which a symbolic dim named `n` is always the same int32 `Var` (one per kernel): the
    placeholders and computes of one lowering share their sizes. Yields the name -> Var map."""
    token = _SIZE_VARS.set({})
    try:
        scope = _SIZE_VARS.get()
        assert scope is not None
        yield scope
    finally:
        _SIZE_VARS.reset(token)


def symbolic_dim(d: SymDim | SumDim) -> PrimExpr:
    """`d` as an expression of the current scope's size variables."""
    scope = _SIZE_VARS.get()
    if scope is None:
        raise TEError(f"symbolic dim {d} outside te.size_vars(): lowering opens that scope")
    return dim_expr(d, lambda name: scope.setdefault(name, Var(name, "int32")))


@attrs.frozen(eq=False, repr=False)
class TensorBuffer(Buffer):
    """The buffer a `Tensor` is read through in tensor expressions; `tensor` is its owner."""

    tensor: Tensor | None = None


class Operation:
    """Base of the operations that produce a tensor."""

    name: str
    shape: tuple[PrimExpr, ...]
    dtype: str
    _output: Tensor

    def __init__(self, name: str, shape: Sequence[PrimExpr], dtype: str) -> None:
        self.name = name
        self.shape = tuple(shape)
        self.dtype = dtype
        self._output = Tensor(self)

    def output(self, index: int = 0) -> Tensor:
        """The operation's output tensor (kiln's operations have exactly one)."""
        if index != 0:
            raise TEError(f"operation {self.name!r} has one output; asked for output {index}")
        return self._output

    @property
    def input_tensors(self) -> list[Tensor]:
        """The tensors this operation reads, in first-read order."""
        return []

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


class PlaceholderOp(Operation):
    """An input tensor that the caller passes."""


class ComputeOp(Operation):
    """One scalar expression per output element: `body` over the `axis` (and `reduce_axis`) variables."""

    def __init__(
        self,
        name: str,
        axis: Sequence[IterVar],
        reduce_axis: Sequence[IterVar],
        body: PrimExpr,
        tag: str = "",
        attrs: Mapping[str, Any] | None = None,
    ) -> None:
        self.axis = tuple(axis)
        self.reduce_axis = tuple(reduce_axis)
        self.body = body
        self.tag = tag
        self.attrs = dict(attrs or {})
        shape = [iv.dom.extent for iv in self.axis if iv.dom is not None]
        super().__init__(name, shape, body.dtype)
        self._inputs = _tensors_read(body)

    @property
    def input_tensors(self) -> list[Tensor]:
        """The tensors the body reads, in first-read order."""
        return list(self._inputs)


class Tensor:
    """The output of an operation: a shape, a dtype and a name; `A[i, j]` reads an element."""

    def __init__(self, op: Operation) -> None:
        self.op = op
        self.buffer = TensorBuffer(op.name, op.shape, op.dtype, "global", self)

    @property
    def shape(self) -> tuple[PrimExpr, ...]:
        """The extents of the dimensions (ints as `IntImm`, symbolic sizes as `Var`)."""
        return self.op.shape

    @property
    def dtype(self) -> str:
        """The element type."""
        return self.op.dtype

    @property
    def name(self) -> str:
        """The producing operation's name."""
        return self.op.name

    @property
    def ndim(self) -> int:
        """The number of dimensions."""
        return len(self.op.shape)

    def __getitem__(self, indices: IndexLike | tuple[IndexLike, ...]) -> BufferLoad:
        idx = indices if isinstance(indices, tuple) else (indices,)
        if len(idx) != self.ndim:
            raise TEError(f"tensor {self.name!r} has {self.ndim} dims, indexed with {len(idx)}")
        exprs = tuple(as_index(i) for i in idx)
        for e in exprs:
            if not tx.is_int(e.dtype) or e.dtype == "bool":
                raise TEError(f"tensor {self.name!r} indexed with a {e.dtype} expression {e}")
        return BufferLoad(self.dtype, self.buffer, exprs)

    def __repr__(self) -> str:
        return f"Tensor({self.name}, [{', '.join(map(str, self.shape))}], {self.dtype})"


# ---------------------------------------------------------------------------
# Reductions (the node; the reducers themselves are in kiln.te.ops)
# ---------------------------------------------------------------------------


@attrs.frozen(eq=False, repr=False)
class CommReducer:
    """A commutative reducer: `combine(acc, x)` and the `identity(dtype)` it starts from."""

    name: str
    combine: Callable[[PrimExpr, PrimExpr], PrimExpr]
    identity: Callable[[str], PrimExpr]


def _iter_var_tuple(axes: Iterable[IterVar]) -> tuple[IterVar, ...]:
    return tuple(axes)


@attrs.frozen(eq=False, repr=False)
class Reduce(PrimExpr):
    """`combiner` over `source` for every point of `axis` where `condition` holds.

    Only valid as the whole body of a `compute`.
    """

    combiner: CommReducer
    source: PrimExpr
    axis: tuple[IterVar, ...] = attrs.field(converter=_iter_var_tuple)
    condition: PrimExpr = attrs.field(factory=lambda: tx.const(True))

    def __str__(self) -> str:
        axes = ", ".join(iv.name for iv in self.axis)
        return f"reduce_{self.combiner.name}({self.source}, axis=[{axes}], where={self.condition})"


# ---------------------------------------------------------------------------
# Constructors
# ---------------------------------------------------------------------------


def var(name: str = "v", dtype: str = "int32") -> Var:
    """A scalar variable, e.g. a symbolic size usable in shapes (`n = te.var("n")`)."""
    return Var(name, dtype)


def _shape(shape: DimLike | Sequence[DimLike], what: str) -> tuple[PrimExpr, ...]:
    dims = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
    out = tuple(as_index(d) for d in dims)
    for d in out:
        if not tx.is_int(d.dtype) or d.dtype == "bool":
            raise TEError(f"{what}: a dimension must be an integer, got {d.dtype} {d}")
        if isinstance(d, tx.IntImm) and d.value < 0:
            raise TEError(f"{what}: negative dimension {d.value}")
    return out


def placeholder(shape: DimLike | Sequence[DimLike], dtype: str = "float32", name: str = "placeholder") -> Tensor:
    """An input tensor of `shape` (ints or `te.var`s) and `dtype`."""
    return PlaceholderOp(name, _shape(shape, f"placeholder {name!r}"), dtype).output()


def reduce_axis(dom: tuple[IndexLike, IndexLike] | Range, name: str = "rv") -> IterVar:
    """A reduction axis over `dom = (begin, end)`, e.g. `te.reduce_axis((0, k), name="k")`."""
    if isinstance(dom, Range):
        rng = dom
    else:
        if len(dom) != 2:
            raise TEError(f"reduce_axis {name!r}: expected (begin, end), got {dom!r}")
        lo, hi = as_index(dom[0]), as_index(dom[1])
        rng = Range(lo, hi - lo)
    return iter_var(name, rng, IterKind.REDUCE)


def thread_axis(dom: tuple[IndexLike, IndexLike] | str | None = None, tag: str = "", name: str = "") -> IterVar:
    """A GPU thread axis, e.g. `te.thread_axis("threadIdx.x")`, for `Stage.bind`."""
    if isinstance(dom, str):
        tag, dom = dom, None
    if not tag:
        raise TEError("thread_axis needs a tag such as 'threadIdx.x' or 'blockIdx.x'")
    rng = None if dom is None else Range(as_index(dom[0]), as_index(dom[1]) - as_index(dom[0]))
    return iter_var(name or tag, rng, IterKind.THREAD, tag)


def _axis_names(fcompute: Callable[..., Any], ndim: int, name: str) -> list[str]:
    try:
        params = list(inspect.signature(fcompute).parameters.values())
    except (TypeError, ValueError):  # builtins without a signature
        return [f"i{d}" for d in range(ndim)]
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params):
        return [f"i{d}" for d in range(ndim)]
    if len(params) != ndim:
        raise TEError(f"compute {name!r}: the shape has {ndim} dims but the lambda takes {len(params)} arguments")
    return [p.name for p in params]


def compute(
    shape: DimLike | Sequence[DimLike],
    fcompute: Callable[..., ExprLike],
    name: str = "compute",
    tag: str = "",
    attrs: Mapping[str, Any] | None = None,
) -> Tensor:
    """A tensor whose element at `(i, j, ...)` is `fcompute(i, j, ...)`.

    The lambda's parameter names name the axes; it receives `tx.Var`s and
    returns a scalar expression, which may be a reduction (`te.sum(...)`) as a
    whole but may not contain one.

    Raises:
        TEError: when the lambda's arity does not match the shape, or a reduction is nested.
    """
    dims = _shape(shape, f"compute {name!r}")
    names = _axis_names(fcompute, len(dims), name)
    axis = [iter_var(n, Range(tx.const(0), d), IterKind.DATA_PAR) for n, d in zip(names, dims, strict=True)]
    result = fcompute(*[iv.var for iv in axis])
    if isinstance(result, (list, tuple)):
        raise TEError(f"compute {name!r}: multiple outputs are not supported; write one compute per output")
    if isinstance(result, Tensor):
        raise TEError(f"compute {name!r}: the lambda returned tensor {result.name!r}; index it (`T[i, j]`)")
    body = as_index(result)
    _check_reduce_placement(body, name)
    reduce_axes = body.axis if isinstance(body, Reduce) else ()
    return ComputeOp(name, axis, reduce_axes, body, tag, attrs).output()


# ---------------------------------------------------------------------------
# Walking expressions (recursion is fine: te lambdas build shallow trees)
# ---------------------------------------------------------------------------


def children(e: PrimExpr) -> tuple[PrimExpr, ...]:
    """The direct sub-expressions of `e`."""
    if isinstance(e, tx.BinaryOp):
        return (e.a, e.b)
    if isinstance(e, tx.Not):
        return (e.a,)
    if isinstance(e, tx.Cast):
        return (e.value,)
    if isinstance(e, tx.Select):
        return (e.cond, e.true_value, e.false_value)
    if isinstance(e, tx.Call):
        return e.args
    if isinstance(e, BufferLoad):
        return e.indices
    if isinstance(e, Reduce):
        return (e.source, e.condition)
    return ()


def _check_reduce_placement(body: PrimExpr, name: str) -> None:
    stack = list(children(body)) if isinstance(body, Reduce) else [body]
    while stack:
        e = stack.pop()
        if isinstance(e, Reduce):
            raise TEError(f"compute {name!r}: a reduction must be the whole body, not part of a larger expression")
        stack.extend(children(e))


def _tensors_read(body: PrimExpr) -> list[Tensor]:
    seen: dict[int, Tensor] = {}
    stack = [body]
    while stack:
        e = stack.pop()
        if isinstance(e, BufferLoad) and isinstance(e.buffer, TensorBuffer) and e.buffer.tensor is not None:
            seen.setdefault(id(e.buffer.tensor), e.buffer.tensor)
        stack.extend(reversed(children(e)))
    return list(seen.values())
