"""What the te tests share: random data, running lowered loop IR in the interpreter, listing its loops."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import tir_interp

from kiln import tir

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
