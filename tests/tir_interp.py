"""A slow, obviously-correct interpreter of loop IR, for checking lowered functions against numpy.

`run(func, *arrays)` executes `func` on numpy arrays with Python loops. Every
load and store is bounds-checked, and temporaries start as NaN (or a sentinel
for integers), so reading an element that was never written shows up.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from kiln import tir

_INT_SENTINEL = -123456789

_CALLS: dict[str, Any] = {
    "exp": math.exp,
    "log": math.log,
    "sqrt": math.sqrt,
    "rsqrt": lambda x: 1.0 / math.sqrt(x),
    "tanh": math.tanh,
    "sigmoid": lambda x: 1.0 / (1.0 + math.exp(-x)),
    "erf": math.erf,
    "pow": math.pow,
    "floor": math.floor,
    "ceil": math.ceil,
    "round": lambda x: float(np.round(x)),
    "abs": abs,
    "sin": math.sin,
    "cos": math.cos,
    "fma": lambda a, b, c: a * b + c,
    "isnan": math.isnan,
    "dot4_u8i8": lambda a, b: int(np.dot(np.array([a], "int32").view("uint8").astype(np.int64),
                                         np.array([b], "int32").view("int8").astype(np.int64))),
}


class _Machine:
    def __init__(self) -> None:
        self.env: dict[int, Any] = {}
        self.arrays: dict[int, np.ndarray] = {}

    def index(self, buf: tir.Buffer, indices: tuple[tir.PrimExpr, ...]) -> tuple[int, ...]:
        arr = self.arrays[id(buf)]
        idx = tuple(int(self.expr(i)) for i in indices)
        for d, (i, n) in enumerate(zip(idx, arr.shape, strict=True)):
            if not 0 <= i < n:
                raise IndexError(f"{buf.name}{list(idx)}: index {i} of dim {d} is outside [0, {n})")
        return idx

    def expr(self, e: tir.PrimExpr) -> Any:
        if isinstance(e, tir.Var):
            return self.env[id(e)]
        if isinstance(e, (tir.IntImm, tir.FloatImm)):
            return bool(e.value) if e.dtype == "bool" else e.value
        if isinstance(e, tir.BufferLoad):
            value = self.arrays[id(e.buffer)][self.index(e.buffer, e.indices)]
            if isinstance(value, np.floating) and np.isnan(value):
                raise ValueError(f"read of uninitialized {e.buffer.name}")
            return value.item()
        if isinstance(e, (tir.And, tir.Or)):
            a = self.expr(e.a)
            if isinstance(e, tir.And):
                return bool(a) and bool(self.expr(e.b))
            return bool(a) or bool(self.expr(e.b))
        if isinstance(e, tir.BinaryOp):
            return self.binary(e, self.expr(e.a), self.expr(e.b))
        if isinstance(e, tir.Not):
            return not self.expr(e.a)
        if isinstance(e, tir.Cast):
            return self.cast(e.dtype, self.expr(e.value))
        if isinstance(e, tir.Select):
            return self.expr(e.true_value) if self.expr(e.cond) else self.expr(e.false_value)
        if isinstance(e, tir.Call) and e.name == "prefetch":
            return 0  # a cache hint: its address is never read, and may lie past the buffer
        if isinstance(e, tir.Call) and e.name == "reinterpret":  # the bits, as numpy's .view reads them
            (x,) = e.args
            return np.array(self.expr(x)).astype(x.dtype).view(e.dtype).item()
        if isinstance(e, tir.Call):
            return _CALLS[e.name](*[self.expr(a) for a in e.args])
        raise TypeError(f"interpreter: unknown expression {type(e).__name__}")

    @staticmethod
    def cast(dtype: str, v: Any) -> Any:
        if dtype == "bool":
            return bool(v)
        if tir.expr.is_float(dtype):
            return float(np.array(v).astype(dtype if dtype != "bfloat16" else "float32"))
        return int(np.array(math.trunc(v)).astype(dtype))

    @staticmethod
    def binary(e: tir.BinaryOp, a: Any, b: Any) -> Any:
        is_int = tir.expr.is_int(e.a.dtype)
        if isinstance(e, tir.Add):
            return a + b
        if isinstance(e, tir.Sub):
            return a - b
        if isinstance(e, tir.Mul):
            return a * b
        if isinstance(e, tir.Div):
            return int(a / b) if is_int else a / b
        if isinstance(e, tir.FloorDiv):
            return a // b if is_int else math.floor(a / b)
        if isinstance(e, tir.FloorMod):
            return a % b
        if isinstance(e, tir.Min):
            return min(a, b)
        if isinstance(e, tir.Max):
            return max(a, b)
        if isinstance(e, (tir.BitAnd, tir.BitOr, tir.BitXor, tir.ShiftLeft, tir.ShiftRight)):
            return _Machine.bits(e, int(a), int(b))
        ops = {tir.EQ: a == b, tir.NE: a != b, tir.LT: a < b, tir.LE: a <= b, tir.GT: a > b, tir.GE: a >= b}
        return ops[type(e)]

    @staticmethod
    def bits(e: tir.BinaryOp, a: int, b: int) -> Any:
        """A bitwise node on Python ints, wrapped to the dtype; a shift amount is read as unsigned (numpy's rule)."""
        dt = e.a.dtype
        if dt == "bool":
            return bool({tir.BitAnd: a & b, tir.BitOr: a | b, tir.BitXor: a ^ b}[type(e)])
        width = np.iinfo(dt).bits
        if isinstance(e, (tir.ShiftLeft, tir.ShiftRight)):
            amount = b % (1 << width)  # a negative amount, as unsigned, is huge
            if amount >= width:
                return -1 if isinstance(e, tir.ShiftRight) and a < 0 else 0
            out = a << amount if isinstance(e, tir.ShiftLeft) else a >> amount
        else:
            out = {tir.BitAnd: a & b, tir.BitOr: a | b, tir.BitXor: a ^ b}[type(e)]
        return int(np.array(out & ((1 << width) - 1), dtype=f"uint{width}").astype(dt))

    def stmt(self, s: tir.Stmt) -> None:
        if isinstance(s, tir.SeqStmt):
            for c in s.stmts:
                self.stmt(c)
        elif isinstance(s, tir.BufferStore):
            idx = self.index(s.buffer, s.indices)
            self.arrays[id(s.buffer)][idx] = self.expr(s.value)
        elif isinstance(s, tir.For):
            lo, ext = int(self.expr(s.min)), int(self.expr(s.extent))
            for i in range(lo, lo + ext):
                self.env[id(s.loop_var)] = i
                self.stmt(s.body)
            self.env.pop(id(s.loop_var), None)
        elif isinstance(s, tir.IfThenElse):
            if self.expr(s.cond):
                self.stmt(s.then_case)
            elif s.else_case is not None:
                self.stmt(s.else_case)
        elif isinstance(s, tir.Allocate):
            b = s.buffer
            shape = tuple(int(self.expr(d)) for d in b.shape)
            fill: Any = np.nan if tir.expr.is_float(b.dtype) else _INT_SENTINEL
            dtype = "float32" if b.dtype == "bfloat16" else b.dtype
            saved = self.arrays.get(id(b))
            self.arrays[id(b)] = np.full(shape, fill, dtype=dtype) if b.dtype != "bool" else np.zeros(shape, bool)
            self.stmt(s.body)
            if saved is not None:
                self.arrays[id(b)] = saved
        elif isinstance(s, tir.LetStmt):
            self.env[id(s.var)] = self.expr(s.value)
            self.stmt(s.body)
        elif isinstance(s, tir.Evaluate):
            self.expr(s.value)
        else:
            raise TypeError(f"interpreter: unknown statement {type(s).__name__}")


def run(func: tir.PrimFunc, *arrays: np.ndarray) -> None:
    """Runs `func` on `arrays` (one per parameter, written in place), binding symbolic dims from their shapes."""
    if len(arrays) != len(func.params):
        raise TypeError(f"{func.name} takes {len(func.params)} arrays, got {len(arrays)}")
    m = _Machine()
    for buf, arr in zip(func.params, arrays, strict=True):
        if arr.ndim != buf.ndim or str(arr.dtype) != buf.dtype:
            raise TypeError(f"{buf.name}: expected {buf.dtype}[{buf.ndim} dims], got {arr.dtype}{list(arr.shape)}")
        for d, n in zip(buf.shape, arr.shape, strict=True):
            if isinstance(d, tir.Var):
                if id(d) in m.env and m.env[id(d)] != n:
                    raise TypeError(f"size {d.name} bound to {m.env[id(d)]} and {n}")
                m.env[id(d)] = n
        m.arrays[id(buf)] = arr
    for buf, arr in zip(func.params, arrays, strict=True):  # dims such as `n + 1`, once every size is bound
        if any(int(m.expr(d)) != n for d, n in zip(buf.shape, arr.shape, strict=True)):
            raise TypeError(f"{buf.name}: expected shape {[str(x) for x in buf.shape]}, got {list(arr.shape)}")
    m.stmt(func.body)


def eval_expr(e: tir.PrimExpr, env: dict[tir.Var, Any] | None = None) -> Any:
    """The value of expression `e` with the variables of `env` bound (no buffers)."""
    m = _Machine()
    m.env = {id(v): x for v, x in (env or {}).items()}
    return m.expr(e)
