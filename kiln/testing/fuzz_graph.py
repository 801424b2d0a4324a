"""The graph builder of the Relay fuzzer: values with their numpy data, and the case it makes.

`GraphBuilder` grows a Relay graph one value at a time from hypothesis draws,
computing each value's numpy data beside its expression and tracking whether
the value is exact (compiled code must give its very bits) or how large an
error compiled code may have on it. `kiln.testing.fuzz_ops` holds the op
families that grow it; `kiln.testing.fuzz` draws and checks whole graphs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import numpy as np
from hypothesis import strategies as st

from kiln import relay
from kiln.ir.module import IRModule
from kiln.relay.expr import Expr, Function, Tuple, Var

Array = np.ndarray[Any, Any]
Draw = Callable[[st.SearchStrategy[Any]], Any]

FLOATS = ("float16", "float32", "float64")
NUMERIC = ("float32", "float64", "int32")  # the dtypes of inputs and constants
CASTS = ("float16", "float32", "float64", "int8", "uint8", "int32", "int64")  # the dtypes casts make
_GRID = 4096.0  # exact float values are multiples of 1/_GRID ...
_EXACT_LIMIT = 2048.0  # ... below this magnitude, so float32 holds them and their sums exactly
_FLOAT_LIMIT = 1e6  # no drawn op makes a float larger than this
_INT_LIMIT = 2**20  # nor an integer
_MAX_ELEMENTS = 1 << 16  # nor a tensor with more elements (past 16K, CPU schedules go parallel)
_SMALL_DIMS = (1, 2, 3, 4, 5)
_LARGE_DIMS = (7, 8, 16, 17, 31, 64, 100)  # vector widths and tiles, with remainders
# the relative error one inexact op may add: a few ulps, as fast vectorized exp/log/erf are allowed
_EPS = {"float16": 1e-3, "float32": 1e-6, "float64": 1e-13}


@attrs.define
class Value:
    """A tensor of the graph being built: its expression, its numpy value, and whether it is exact.

    `exact` means the value is computed without rounding (integers; floats on the grid computed by
    exact ops), so compiled code must produce the very same bits; otherwise `err` bounds how far
    compiled code may drift from numpy, grown op by op from the rounding of each and its gain.
    """

    expr: Expr
    data: Array
    exact: bool
    err: float = 0.0  # a bound of its absolute error: how far compiled code may be from numpy

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    @property
    def dtype(self) -> str:
        return str(self.data.dtype)

    @property
    def is_float(self) -> bool:
        return self.dtype in FLOATS


@attrs.frozen(repr=False)
class FuzzCase:
    """A random graph, its inputs and numpy's outputs for them (a tuple when the graph has several)."""

    func: Function
    inputs: dict[str, Array]
    expected: tuple[Array, ...]
    multiple: bool
    exact: tuple[bool, ...] = ()  # per output: must compiled code give numpy's very bits (default: all)
    errors: tuple[float, ...] = ()  # per output: the absolute error allowed where it need not
    opt_level: int = 3  # relay.build's PassContext: opt level 0 fuses nothing
    max_depth: int | None = None  # relay.FuseOps.max_depth: small values cut groups in odd places

    def __str__(self) -> str:
        shapes = ", ".join(f"{k}: {v.dtype}{list(v.shape)}" for k, v in self.inputs.items())
        config = f"opt_level={self.opt_level}" + (f", max_depth={self.max_depth}" if self.max_depth else "")
        return f"{IRModule.from_expr(self.func)}\ninputs: {shapes}\nbuilt with {config}"

    __repr__ = __str__

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """How hypothesis prints a falsifying example: the module's text, not the attrs fields."""
        printer.text(str(self))


def _on_grid(data: Array) -> bool:
    if data.size == 0:
        return True
    wide = data.astype(np.float64)
    return bool(np.all(np.abs(wide) < _EXACT_LIMIT) and np.all(wide * _GRID == np.round(wide * _GRID)))


def _size(shape: Sequence[int]) -> int:
    return math.prod(shape)


def _broadcast(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...] | None:
    try:
        return tuple(np.broadcast_shapes(tuple(a), tuple(b)))
    except ValueError:
        return None


class GraphBuilder:
    """Grows a graph op by op from hypothesis draws; `build()` makes the `FuzzCase`."""

    def __init__(self, draw: Draw, zero_dims: bool) -> None:
        self.draw = draw
        self.zero_dims = zero_dims
        self.rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        self.pool: list[Value] = []
        self.params: list[Var] = []
        self.inputs: dict[str, Array] = {}
        self.consumed: set[int] = set()
        self.tuples: list[tuple[Expr, list[Value]]] = []  # tuple-valued expressions and their fields
        self._names = 0

    # --- draws -------------------------------------------------------------------------

    def choose(self, options: Sequence[Any]) -> Any:
        return self.draw(st.sampled_from(list(options)))

    def integer(self, lo: int, hi: int) -> int:
        return int(self.draw(st.integers(lo, hi)))

    def flag(self) -> bool:
        return bool(self.draw(st.booleans()))

    def dim(self) -> int:
        """A dim: mostly small, sometimes 0 (one in ten, when allowed), sometimes large."""
        kind = self.integer(0, 9)
        if kind == 9 and self.zero_dims:
            return 0
        return int(self.choose(_LARGE_DIMS if kind == 8 else _SMALL_DIMS))

    def shape(self, min_rank: int = 0, max_rank: int = 4) -> tuple[int, ...]:
        """A shape; one in eight is made of large dims only (work enough for the parallel schedules)."""
        rank = self.integer(min_rank, max_rank)
        if rank and self.integer(0, 7) == 7:
            shape = tuple(int(self.choose(_LARGE_DIMS)) for _ in range(rank))
        else:
            shape = tuple(self.dim() for _ in range(rank))
        while _size(shape) > _MAX_ELEMENTS // 2:  # halve the largest dim until the tensor is small enough
            i = int(np.argmax(shape))
            shape = (*shape[:i], shape[i] // 2, *shape[i + 1 :])
        return shape

    def pick(self, accept: Callable[[Value], bool]) -> Value | None:
        """A value of the pool that `accept`s, or None."""
        fits = [v for v in self.pool if accept(v)]
        return self.choose(fits) if fits else None

    # --- leaves ------------------------------------------------------------------------

    def leaf(self, shape: tuple[int, ...], dtype: str) -> Value:
        """A new input or constant of `shape` and `dtype`, filled from the grid of exact values."""
        if dtype == "bool":
            data: Array = self.rng.random(shape) < 0.5
        elif dtype in FLOATS:
            data = (self.rng.integers(-8, 9, shape) / 4).astype(dtype)
        else:
            data = self.rng.integers(0 if dtype.startswith("u") else -5, 6, shape).astype(dtype)
        data = np.asarray(data)
        expr: Expr
        if self.integer(0, 3) == 3:  # a constant, one leaf in four (the rest stay for the kernels to compute)
            expr = relay.const(data.copy(), dtype)
        else:
            name = f"x{self._names}"
            self._names += 1
            expr = relay.var(name, shape=shape, dtype=dtype)
            assert isinstance(expr, Var)
            self.params.append(expr)
            self.inputs[name] = data
        value = Value(expr, data, True)
        self.pool.append(value)
        return value

    def new_leaf(self) -> Value:
        return self.leaf(self.shape(), self.choose(NUMERIC))

    def partner(self, v: Value, dtype: str | None = None) -> Value | None:
        """A second operand for `v` whose shape broadcasts with v's: from the pool, or a new leaf."""
        dtype = dtype or v.dtype

        def fits(u: Value) -> bool:
            out = _broadcast(u.shape, v.shape)
            return u.dtype == dtype and out is not None and _size(out) <= _MAX_ELEMENTS

        if self.flag():
            found = self.pick(fits)
            if found is not None:
                return found
        shape: list[int] = []
        for d in v.shape[self.integer(0, len(v.shape)) if self.flag() else 0 :]:
            shape.append(self.choose([d, 1]) if d != 1 else self.choose([1, self.dim()]))
        if len(shape) < 4 and self.flag():
            shape = [self.dim() for _ in range(self.integer(1, 4 - len(shape)))] + shape
        out = _broadcast(shape, v.shape)
        if out is None or _size(out) > _MAX_ELEMENTS:
            return None
        return self.leaf(tuple(shape), dtype)

    # --- results -----------------------------------------------------------------------

    def result(
        self, expr: Expr, data: Any, inputs: Sequence[Value], exact: bool, dtype: str | None = None, gain: float = 1.0
    ) -> Value | None:
        """Adds `expr` (numpy value `data`) to the pool, unless its value leaves the safe range.

        Args:
            expr: the new expression.
            data: numpy's value of it (computed wider for integers, to see overflow).
            inputs: the values it reads.
            exact: whether the op is exact on exact inputs (its float result is then checked on the grid).
            dtype: the result dtype (default: the first input's).
            gain: how much the op may magnify its inputs' absolute errors.

        Returns:
            The new value, or None when it is too large, not finite, or has too many elements.
        """
        dtype = dtype or inputs[0].dtype
        wide = np.asarray(data)
        if wide.size > _MAX_ELEMENTS:
            return None
        if wide.size and wide.dtype != np.bool_:
            as_float = wide.astype(np.float64)
            magnitude = float(np.max(np.abs(as_float)))
            if dtype in FLOATS:
                lo, hi = -_FLOAT_LIMIT, _FLOAT_LIMIT
                if dtype == "float16":
                    lo, hi = -30000.0, 30000.0  # float16 ends at 65504
            else:
                info = np.iinfo(dtype)  # no overflow, not even a wrapping one: compiled code may assume none
                lo, hi = max(info.min, -_INT_LIMIT), min(info.max, _INT_LIMIT)
            if not math.isfinite(magnitude) or float(np.min(as_float)) < lo or float(np.max(as_float)) > hi:
                return None
        out = np.asarray(wide.astype(dtype))
        # float16 is a storage type: compiled code may compute a fused group in float32, rounding once
        is_exact = exact and all(u.exact for u in inputs) and dtype != "float16" and (
            dtype not in FLOATS or _on_grid(out))
        err = 0.0
        if not is_exact and dtype in FLOATS:
            magnitude = max(1.0, float(np.max(np.abs(out)))) if out.size else 1.0
            err = gain * sum(u.err for u in inputs) + _EPS[dtype] * magnitude
        for u in inputs:
            self.consumed.add(id(u))
        value = Value(expr, out, is_exact, err)
        self.pool.append(value)
        return value

    def build(self) -> FuzzCase:
        """The function whose outputs are the values nothing consumed (and sometimes one that was)."""
        outputs = [v for v in self.pool if id(v) not in self.consumed]
        if len(self.pool) > 1 and self.flag():  # an output that other ops also read
            extra = self.choose(self.pool)
            outputs.append(extra)  # maybe twice: one value in two places of the result
        if not outputs:  # pragma: no cover - the last value added is never consumed
            outputs = [self.pool[-1]]
        exprs = [v.expr for v in outputs]
        if self.tuples and self.flag():  # a whole tuple among the outputs: a nested result
            whole, fields = self.choose(self.tuples)
            at = self.integer(0, len(exprs))
            exprs.insert(at, whole)
            outputs[at:at] = fields  # the outputs before `at` are one tensor each
        body: Expr = exprs[0] if len(exprs) == 1 else Tuple(exprs)
        func = Function(self.params, body)
        opt_level = self.choose([3, 2, 1, 0])
        max_depth = self.choose([None, 2, 3, 5])
        return FuzzCase(func, dict(self.inputs), tuple(v.data for v in outputs), len(exprs) > 1,
                        tuple(v.exact for v in outputs), tuple(v.err for v in outputs), opt_level, max_depth)
