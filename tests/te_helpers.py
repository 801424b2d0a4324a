"""What the te tests share: random data, running lowered loop IR in the interpreter, listing its loops, and a
two-kernel GPU schedule."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import tir_interp

from kiln import te, tir

RNG = np.random.default_rng(0)


def rand(*shape: int, dtype: str = "float32") -> np.ndarray:
    return RNG.standard_normal(shape).astype(dtype)


def run(
    func: tir.PrimFunc, inputs: Sequence[np.ndarray], out_shapes: Sequence[tuple[int, ...]], out_dtype: str = "float32"
) -> list[np.ndarray]:
    outs = [np.zeros(s, dtype=out_dtype) for s in out_shapes]
    tir_interp.run(func, *inputs, *outs)
    return outs


def loops(func: tir.PrimFunc) -> list[tir.For]:
    """Every For of `func`, in pre-order."""
    out: list[tir.For] = []
    stack: list[tir.Stmt] = [func.body]
    while stack:
        s = stack.pop()
        if isinstance(s, tir.For):
            out.append(s)
            stack.append(s.body)
        elif isinstance(s, tir.SeqStmt):
            stack.extend(reversed(s.stmts))
        elif isinstance(s, (tir.Allocate, tir.LetStmt)):
            stack.append(s.body)
        elif isinstance(s, tir.IfThenElse):
            stack.extend(x for x in (s.else_case, s.then_case) if x is not None)
    return out


def two_stages(n: Any) -> tuple[te.Schedule, list[te.Tensor]]:
    """C = A + B into a temporary (a workspace on cuda), D = C * 2: two GPU kernels over size n (an int or a
    te.var), 32 threads a block."""
    A = te.placeholder((n,), name="A")
    B = te.placeholder((n,), name="B")
    C = te.compute((n,), lambda i: A[i] + B[i], name="C")
    D = te.compute((n,), lambda i: C[i] * 2.0, name="D")
    s = te.create_schedule([D])
    for t in (C, D):
        bx, tx = s[t].split(t.op.axis[0], factor=32)
        s[t].bind(bx, te.thread_axis("blockIdx.x"))
        s[t].bind(tx, te.thread_axis("threadIdx.x"))
    return s, [A, B, D]
