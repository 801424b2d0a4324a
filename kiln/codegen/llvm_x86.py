"""x86 code for the llvm back end: the int8 dot products of AVX-512 VNNI (`vpdpbusd`).

`dot4_u8i8(a, b)` (`kiln.tir.expr.INTRINSICS`) sums the products of int32 `a`'s four bytes,
unsigned, with `b`'s, signed, in int32. Alone it is emitted as four widened products and their
sum. A vectorized loop whose body is the accumulation `c[i] = c[i] + dot4_u8i8(x, y[j])`, x the
same in every lane and `i`, `j` advancing by one per lane, is emitted by `emit_dot_loop` as one
`llvm.x86.avx512.vpdpbusd.512` per 16 lanes: 64 byte products summed into 16 int32 lanes, the
accumulator the instruction's first operand. The codegen writes these vectors itself: LLVM's loop
vectorizer widens the scalar form to unpacks, multiplies and adds, and no pattern of x86's
instruction selection makes `vpdpbusd` of them.
"""

from __future__ import annotations

from typing import Any

import attrs
import llvmlite.ir as ir

from kiln.codegen import llvm_math
from kiln.tir.expr import Add, BufferLoad, Call, Cast, IntImm, PrimExpr, Var
from kiln.tir.functor import post_order_visit, structural_key, used_vars
from kiln.tir.simplify import Analyzer
from kiln.tir.stmt import BufferStore, For, ForKind
from kiln.tir.transform import substitute

DOT4 = "dot4_u8i8"
LANES = 16  # int32 lanes of a zmm register
_I8, _I32 = ir.IntType(8), ir.IntType(32)
_V16 = ir.VectorType(_I32, LANES)
_V64 = ir.VectorType(_I8, 4 * LANES)
_VPDPBUSD = "llvm.x86.avx512.vpdpbusd.512"


def dot4(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    """The scalar `dot4_u8i8(x, y)`: x's bytes zero-extended times y's sign-extended, summed (i32)."""
    v4, w4 = ir.VectorType(_I8, 4), ir.VectorType(_I32, 4)
    products = b.mul(b.zext(b.bitcast(x, v4), w4), b.sext(b.bitcast(y, v4), w4))
    return llvm_math.intrinsic(b, "llvm.vector.reduce.add.v4i32", _I32, [products])


@attrs.frozen
class DotLoop:
    """A vectorized loop `c[i] = c[i] + dot4_u8i8(x, y[j])` that `emit_dot_loop` writes as vpdpbusd."""

    store: BufferStore
    x: PrimExpr  # the same in every lane
    y: BufferLoad


def _unit_stride(index: PrimExpr, var: Var) -> bool:
    while isinstance(index, Cast) and index.value.dtype in ("int32", "int64"):  # flatten's widening to int64
        index = index.value
    step = Analyzer().simplify(substitute(index, {var: var + 1}) - index)
    return isinstance(step, IntImm) and step.value == 1


def match_dot_loop(s: For) -> DotLoop | None:
    """`s` as a `DotLoop`, when it is one: vectorized, a constant number of whole 16-lane vectors."""
    if s.kind is not ForKind.VECTORIZED or not isinstance(s.min, IntImm) or not isinstance(s.extent, IntImm) \
            or s.extent.value % LANES or not isinstance(s.body, BufferStore):
        return None
    store, var = s.body, s.loop_var
    value = store.value
    if not isinstance(value, Add) or value.dtype != "int32":
        return None
    acc, dot = (value.a, value.b) if isinstance(value.b, Call) else (value.b, value.a)
    if not (isinstance(dot, Call) and dot.name == DOT4 and isinstance(acc, BufferLoad) and acc.buffer is store.buffer
            and structural_key(acc.indices[0]) == structural_key(store.indices[0])):
        return None
    x, y = dot.args
    if not isinstance(y, BufferLoad) or var in used_vars(x):
        return None
    read: list[bool] = []
    for operand in (x, y):
        post_order_visit(operand, lambda n: read.append(isinstance(n, BufferLoad) and n.buffer is store.buffer))
    if any(read):
        return None  # c read by an operand: the lanes' order would show (they are computed all at once)
    if not (_unit_stride(store.indices[0], var) and _unit_stride(y.indices[0], var)):
        return None
    return DotLoop(store, x, y)


def emit_dot_loop(cg: Any, s: For, loop: DotLoop) -> None:
    """Emits `loop` (of `s`) as one vpdpbusd per 16 lanes, unrolled: a register tile's accumulators
    stay in registers once LLVM promotes the tile (constant offsets)."""
    b: ir.IRBuilder = cg.f.builder
    ptr = _V16.as_pointer()  # a typed pointer: llvmlite checks a store's type against it
    var = s.loop_var
    assert isinstance(s.min, IntImm) and isinstance(s.extent, IntImm)
    x = None
    for lane in range(s.min.value, s.min.value + s.extent.value, LANES):
        cg.f.vars[id(var)] = ir.Constant(_reg_of(var), lane)
        if x is None:  # the same in every lane: one broadcast
            scalar = cg.expr(loop.x)
            x = b.bitcast(b.shuffle_vector(b.insert_element(ir.Constant(_V16, ir.Undefined), scalar, _I32(0)),
                                           ir.Constant(_V16, ir.Undefined), ir.Constant(_V16, [0] * LANES)), _V64)
        c_ptr = b.bitcast(cg._address(loop.store.buffer, loop.store.indices[0]), ptr)
        y_ptr = b.bitcast(cg._address(loop.y.buffer, loop.y.indices[0]), ptr)
        acc = b.load(c_ptr, typ=_V16, align=4)
        y = b.bitcast(b.load(y_ptr, typ=_V16, align=4), _V64)
        b.store(llvm_math.intrinsic(b, _VPDPBUSD, _V16, [acc, x, y]), c_ptr, align=4)
    cg.f.vars.pop(id(var), None)


def _reg_of(var: Var) -> ir.Type:
    return ir.IntType(64) if var.dtype == "int64" else _I32
