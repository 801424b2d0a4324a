"""Vectorized loops as CUDA vector loads and stores (`float4`, `uint4`, ...).

A loop a schedule marks VECTORIZED (`Stage.vectorize`) whose body is one store
to consecutive, aligned elements becomes one vector store of all its lanes,
and each load in the stored value that reads consecutive, aligned elements
becomes one vector load: `*(const uint4*)&x[i]` for eight float16 values or
four float32 ones, 16 bytes in one instruction where a scalar loop issues
four or eight. The value is computed lane by lane in between (registers).

"Aligned" is proven, never assumed: the first lane's offset is a multiple of
the lane count in every term of its linear form (`base = 8*i + 64*j`), so
the address is a multiple of the vector's size given the buffer's own
alignment: shared memory slices are 16-byte aligned, and every array a
kernel is launched on is too (`kiln.runtime.cuda_module` checks; cupy's
allocations are 256-byte aligned, and the executor copies inputs that are
not). A loop that does not qualify (a guard inside it, a store or load that
strides, 32-byte vectors, a local buffer) stays a scalar loop under
`#pragma unroll`.
"""

from __future__ import annotations

import re
from collections.abc import Hashable
from typing import Protocol

from kiln.codegen.cuda_types import ctype
from kiln.ir.dtype import DataType
from kiln.tir.async_copy import ASYNC_COPY
from kiln.tir.expr import Add, Buffer, BufferLoad, Cast, FloorDiv, FloorMod, IntImm, Max, Min, Mul, PrimExpr, Sub, Var
from kiln.tir.functor import StmtExprMutator, buffer_loads, structural_key
from kiln.tir.simplify import Analyzer
from kiln.tir.stmt import BufferStore, For
from kiln.tir.transform import substitute

INT32_MAX = 2**31 - 1
VECTOR_TYPES = {4: "unsigned int", 8: "uint2", 16: "uint4"}  # bytes -> the CUDA type moved in one access


class _Writer(Protocol):
    ana: Analyzer

    def emit(self, line: str) -> None: ...
    def expr(self, e: PrimExpr) -> str: ...
    def _access(self, buf: Buffer, index: PrimExpr) -> str: ...
    def _declare(self, var: Var) -> str: ...


class _Replace(StmtExprMutator):
    def __init__(self, by: dict[int, Var]) -> None:
        super().__init__()
        self.by = by

    def visit_buffer_load(self, e: BufferLoad) -> PrimExpr:
        var = self.by.get(id(e))
        return super().visit_buffer_load(e) if var is None else var


def narrow_index(e: PrimExpr) -> PrimExpr | None:
    """`e` (an int64 offset built by flatten) recomputed in int32, or None where it uses int64 values."""
    if e.dtype == "int32":
        return e
    if isinstance(e, IntImm) and e.dtype == "int64":
        return IntImm("int32", e.value) if -INT32_MAX - 1 <= e.value <= INT32_MAX else None
    if isinstance(e, Cast) and e.dtype == "int64":
        if e.value.dtype == "int32":
            return e.value
        if e.value.dtype in ("int8", "int16", "uint8", "uint16", "bool"):
            return Cast("int32", e.value)
        return None
    if isinstance(e, (Add, Sub, Mul, FloorDiv, FloorMod, Min, Max)) and e.dtype == "int64":
        a, b = narrow_index(e.a), narrow_index(e.b)
        if a is None or b is None:
            return None
        return type(e)("int32", a, b)
    return None


def _step(ana: Analyzer, index: PrimExpr, v: Var, lanes: int) -> int | None:
    """How far `index` moves per lane of `v` (constant over the lanes), or None."""
    narrow = narrow_index(index)
    index = index if narrow is None else narrow
    at = [ana.simplify(substitute(index, {v: IntImm(v.dtype, k)})) for k in (0, 1, lanes - 1)]
    steps = [ana.simplify(at[1] - at[0]), ana.simplify(at[2] - at[0])]
    if not all(isinstance(d, IntImm) for d in steps):
        return None
    one, last = (int(d.value) for d in steps if isinstance(d, IntImm))
    return one if last == one * (lanes - 1) else None


def _aligned(ana: Analyzer, base: PrimExpr, lanes: int) -> bool:
    narrow = narrow_index(base)
    return ana.linear(base if narrow is None else narrow).divisible(lanes)


def _vectorizable(buf: Buffer, lanes: int) -> bool:
    return buf.scope in ("global", "shared") and buf.dtype != "bool" and \
        lanes * DataType.of(buf.dtype).bytes in VECTOR_TYPES


def emit_vectorized(w: _Writer, s: For) -> bool:
    """Emits VECTORIZED loop `s` as vector accesses where it qualifies (see the module docstring);
    False, having emitted nothing, where it does not."""
    store = s.body
    if not (isinstance(s.extent, IntImm) and isinstance(s.min, IntImm) and int(s.min.value) == 0
            and isinstance(store, BufferStore) and len(store.indices) == 1):
        return False
    lanes, v = int(s.extent.value), s.loop_var

    def first(index: PrimExpr) -> PrimExpr:  # the offset of lane 0
        return w.ana.simplify(substitute(index, {v: IntImm(v.dtype, 0)}))

    (index,) = store.indices
    base = first(index)
    if not (_vectorizable(store.buffer, lanes) and _step(w.ana, index, v, lanes) == 1
            and _aligned(w.ana, base, lanes)):
        return False
    vector_loads = [ld for ld in buffer_loads(store.value) if len(ld.indices) == 1 and _vectorizable(ld.buffer, lanes)
                    and _step(w.ana, ld.indices[0], v, lanes) == 1 and _aligned(w.ana, first(ld.indices[0]), lanes)]
    value = store.value
    if (s.annotations.get(ASYNC_COPY, False) is not False and store.buffer.scope == "shared"
            and isinstance(value, BufferLoad) and any(value is ld for ld in vector_loads)
            and value.buffer.scope == "global"
            and lanes * DataType.of(store.buffer.dtype).bytes == 16 and value.dtype == store.buffer.dtype):
        src = w._access(value.buffer, first(value.indices[0]))
        w.emit(f"kiln_cp_async16(&{w._access(store.buffer, base)}, &{src});")
        return True
    w.emit("{")
    lane_vars: dict[int, list[Var]] = {}
    loaded: dict[tuple[int, Hashable], list[Var]] = {}  # one vector load per buffer and offset
    for ld in vector_loads:
        start = first(ld.indices[0])
        key = (id(ld.buffer), structural_key(start))
        if key not in loaded:
            vt = VECTOR_TYPES[lanes * DataType.of(ld.dtype).bytes]
            name = f"kiln_vec{len(loaded)}"
            w.emit(f"  alignas(16) {ctype(ld.dtype)} {name}[{lanes}];")
            w.emit(f"  *({vt}*){name} = *(const {vt}*)&{w._access(ld.buffer, start)};")
            loaded[key] = [Var(f"{name}_{k}", ld.dtype) for k in range(lanes)]
            for k, var in enumerate(loaded[key]):
                w.emit(f"  const {ctype(ld.dtype)} {w._declare(var)} = {name}[{k}];")
        lane_vars[id(ld)] = loaded[key]
    out = "kiln_vec_out"
    w.emit(f"  alignas(16) {ctype(store.buffer.dtype)} {out}[{lanes}];")
    for k in range(lanes):
        value = _Replace({i: vs[k] for i, vs in lane_vars.items()}).visit_expr(store.value)
        value = substitute(value, {v: IntImm(v.dtype, k)})
        w.emit(f"  {out}[{k}] = {w.expr(value)};")
    vt = VECTOR_TYPES[lanes * DataType.of(store.buffer.dtype).bytes]
    w.emit(f"  *({vt}*)&{w._access(store.buffer, base)} = *(const {vt}*){out};")
    w.emit("}")
    return True


# `kiln.async_copy` copies (16 bytes, global to shared) as cp.async (sm_80 and newer); a kernel that issues
# them waits for all of them before each of its barriers (`with_async_waits`). The test stand-in, which
# defines KILN_HOST_EMULATION, copies at once.
ASYNC_PRELUDE = r"""#ifndef KILN_HOST_EMULATION
__device__ __forceinline__ void kiln_cp_async16(void* dst, const void* src) {
  const unsigned at = (unsigned)__cvta_generic_to_shared(dst);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" : : "r"(at), "l"(src));
}
__device__ __forceinline__ void kiln_cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" : : : "memory"); }
#else
static inline void kiln_cp_async16(void* dst, const void* src) { memcpy(dst, src, 16); }
static inline void kiln_cp_async_wait_all() {}
#endif
"""


def with_async_waits(kernel: str) -> str:
    """`kernel`'s C text with a wait for its asynchronous copies before each barrier, if it issues any."""
    if "kiln_cp_async16(" not in kernel:
        return kernel
    return re.sub(r"^(\s*)__syncthreads\(\);", r"\1kiln_cp_async_wait_all();\n\1__syncthreads();", kernel,
                  flags=re.MULTILINE)
