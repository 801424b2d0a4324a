"""Loop IR to LLVM IR (llvmlite.ir), one `PrimFunc` per LLVM module.

The kernel ABI: `i32 name(T0* noalias p0, ..., i64 s0, ...)`: one pointer per
buffer parameter, in order, then one int64 per symbolic dim
(`PrimFunc.size_vars`, first-seen order). Buffers are flattened to 1-D
row-major (`kiln.tir.flatten`) and indexed with int64 offsets. It returns
`STATUS_OK`, or `STATUS_OUT_OF_MEMORY` when a heap temporary could not be had.

Choices, and why:
- Loops are emitted as phi loops; VECTORIZED loops carry `llvm.loop.vectorize.*`
  metadata (width: the vector register over the widest stored element, capped by a
  small constant extent; a constant extent that is no multiple of it runs as whole vectors and then a
  loop of the rest, of narrower vectors), UNROLLED loops of constant extent <= 64 are unrolled here,
  others get `llvm.loop.unroll.enable`.
- PARALLEL loops are outlined into a body function (noalias pointer params, so the
  alias facts survive) and a trampoline that kiln's own thread pool
  (`runtime.pool`, `kiln_parallel_for`) runs per chunk of iterations on up to
  `num-cores` threads, the calling thread among them. A parallel loop inside
  another one runs serially. The body clamps its chunk to the loop's constant range, so
  that LLVM knows the loop variable's range.
- Floating-point add/sub/mul carry `reassoc contract` (reductions vectorize, a*b+c
  fuses to fma); no `nnan`/`ninf`/`nsz`, so inf and NaN behave as in numpy.
  Signed int32/int64 add/sub/mul carry `nsw` (their overflow is undefined, as in C
  and TVM: index arithmetic then widens and vectorizes); int8/int16 and the unsigned types wrap.
- Temporaries of constant size up to 64 KiB live on the stack (an alloca in the entry
  block, which LLVM promotes to registers); larger or symbolic ones come from
  `aligned_alloc` (64-byte aligned) and are freed on every way out, so a 4 MiB packed
  panel never overflows a thread's stack.
- Integer division and modulo by zero give 0 (as numpy), never a trap, and so do shifts
  out of [0, width) (-1 for a negative value shifted right), where LLVM's are poison
  (`llvm_int`); float to int casts saturate (clamps, then a plain conversion: it
  vectorizes), NaN to 0.
- A kernel that divides a loop variable carries `!kiln.no_slp` and is optimized without
  the SLP vectorizer: LLVM 22.1's SLP turns an `add nuw x, 3` bundled with `sub nuw`
  lanes into `sub nuw x, -3`, which is poison (llvm_process.wants_slp). A vectorized loop
  whose variable is divided by a power of two 2^k gets at most 2^k lanes and no interleaving:
  LLVM 22.1's loop vectorizer reads `p[(i & (2^k - 1)) | base]` as consecutive across the
  wrap (`llvm_lanes`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import llvmlite.ir as ir
import numpy as np

from kiln.codegen import llvm_int, llvm_lanes, llvm_math, llvm_process, llvm_x86
from kiln.codegen.jit import CodegenError
from kiln.ir import graph
from kiln.ir.dtype import NARROW_FLOATS, DataType
from kiln.runtime import linker, pool
from kiln.runtime.module import STATUS_OK, STATUS_OUT_OF_MEMORY, dim_text, on_heap
from kiln.target import Target
from kiln.tir.allreduce import ALLREDUCE
from kiln.tir.expr import (
    EQ,
    GE,
    GT,
    LE,
    LT,
    NE,
    Add,
    And,
    BinaryOp,
    BufferLoad,
    Call,
    Cast,
    Div,
    FloatImm,
    FloorDiv,
    FloorMod,
    IntImm,
    Max,
    Min,
    Mul,
    Not,
    Or,
    PrimExpr,
    Select,
    Sub,
    Var,
    is_float,
)
from kiln.tir.flatten import flatten
from kiln.tir.functor import Node, children, let_chain
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
)

I1, I8, I32, I64 = ir.IntType(1), ir.IntType(8), ir.IntType(32), ir.IntType(64)
PTR = ir.PointerType()

F16 = ir.HalfType()

# dtype -> (register type, memory type, bits in memory). float16 and bfloat16 are storage types:
# their values are float registers, widened on load and rounded to their precision on store and on
# casts. In memory they are i16, converted by kiln's own code (llvm_math), or for float16 by F16C's
# instructions where the target has them: LLVM's `half` and `bfloat` conversions would call
# runtime functions no library defines.
_TYPES: dict[str, tuple[ir.Type, ir.Type, int]] = {
    "float16": (llvm_math.F32, llvm_math.I16, 16),
    "bfloat16": (llvm_math.F32, llvm_math.I16, 16),
    "float32": (llvm_math.F32, llvm_math.F32, 32),
    "float64": (llvm_math.F64, llvm_math.F64, 64),
    "int8": (I8, I8, 8),
    "int16": (ir.IntType(16), ir.IntType(16), 16),
    "int32": (I32, I32, 32),
    "int64": (I64, I64, 64),
    "uint8": (I8, I8, 8),
    "uint16": (ir.IntType(16), ir.IntType(16), 16),
    "uint32": (I32, I32, 32),
    "uint64": (I64, I64, 64),
    "bool": (I1, I8, 8),
}
_FLOAT_FLAGS = ("reassoc", "contract")
_CMP = {EQ: "==", NE: "!=", LT: "<", LE: "<=", GT: ">", GE: ">="}
_UNROLL_LIMIT = 64


def supported_dtypes() -> tuple[str, ...]:
    """The dtypes the LLVM back end compiles."""
    return tuple(_TYPES)


def _reg(dtype: str) -> ir.Type:
    try:
        return _TYPES[dtype][0]
    except KeyError:
        raise CodegenError(f"the llvm back end does not support dtype {dtype!r}; "
                           f"supported: {', '.join(_TYPES)}") from None


def _mem(dtype: str) -> ir.Type:
    _reg(dtype)
    return _TYPES[dtype][1]


_signed = llvm_int.signed


class _LoopMD(ir.values.MDValue):  # type: ignore[misc]  # llvmlite has no stubs
    """A distinct, self-referential loop ID: `!N = distinct !{!N, props...}`."""

    def __init__(self, module: ir.Module, props: list[Any]) -> None:
        super().__init__(module, [], name=str(len(module.metadata)))
        self.operands = (self, *props)

    def descr(self, buf: list[str]) -> None:
        buf.append("distinct ")
        super().descr(buf)

    def __eq__(self, other: object) -> bool:
        return self is other

    def __hash__(self) -> int:
        return id(self)


class _Func:
    """The state of the function being emitted: builder, alloca point, bound vars and buffers."""

    def __init__(self, fn: ir.Function) -> None:
        self.fn = fn
        # Allocas live in their own entry block, so that inserting one never moves the main builder.
        entry = fn.append_basic_block("allocas")
        start = fn.append_basic_block("entry")
        self.alloca_builder = ir.IRBuilder(entry)
        self._alloca_end = self.alloca_builder.branch(start)
        self.builder = ir.IRBuilder(start)
        self.vars: dict[int, ir.Value] = {}
        self.bufs: dict[int, ir.Value] = {}
        self.in_parallel = False
        self.heap: list[ir.Value] = []  # live heap temporaries, outermost first (freed on every way out)
        self.failed: ir.Value | None = None  # in a parallel body: the i32 flag it sets when out of memory

    def alloca(self, ty: ir.Type, count: int | None, name: str) -> ir.Value:
        """A stack slot in the entry block (so LLVM promotes it to registers)."""
        self.alloca_builder.position_before(self._alloca_end)
        return self.alloca_builder.alloca(ty, size=None if count is None else I64(count), name=name)


class CodeGenLLVM:
    """Emits one PrimFunc as an LLVM module for one llvm `Target`."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.cpu, self.features = linker.cpu_and_features(target)
        self.avx512 = linker.has_feature(target, "avx512f")
        if self.avx512:
            self.vector_bits = 512
        elif linker.has_feature(target, "avx2") or linker.has_feature(target, "avx"):
            self.vector_bits = 256
        else:
            self.vector_bits = 128
        self.f16c = linker.has_feature(target, "f16c")
        self.vnni = self.avx512 and linker.has_feature(target, "avx512vnni")  # vpdpbusd (llvm_x86)
        self.num_threads = int(target.get("num-cores", 1))
        self.module = ir.Module()
        self.f: _Func
        self._par_count = 0

    # -- module and functions -------------------------------------------------------------

    def compile(self, func: PrimFunc) -> str:
        """The LLVM IR text of `func` (before optimization)."""
        size_vars = func.size_vars
        flat = flatten(func)
        self.module = ir.Module(name=func.name)
        self.module.triple = linker.target_triple(self.target)
        args = [PTR] * len(flat.params) + [I64] * len(size_vars)
        fn = self._function(linker.kernel_symbol(func.name), ir.FunctionType(I32, args), internal=False)
        self.f = _Func(fn)
        for i, buf in enumerate(flat.params):
            fn.args[i].name = buf.name
            self.f.bufs[id(buf)] = fn.args[i]
        for j, var in enumerate(size_vars):
            arg = fn.args[len(flat.params) + j]
            arg.name = var.name
            self.f.vars[id(var)] = self._int_resize(arg, "int64", var.dtype)
        self.stmt(flat.body)
        self.f.builder.ret(I32(STATUS_OK))
        self._embed_signature(func)
        root: Node = flat.body
        loop_vars = [n.loop_var for n in graph.post_order([root], children) if isinstance(n, For)]
        if llvm_lanes.divides(flat.body, *loop_vars):  # LLVM 22's SLP vectorizer miscompiles its index arithmetic
            self.module.add_named_metadata(llvm_process.NO_SLP, ["divides a loop variable"])
        return str(self.module)

    def _embed_signature(self, func: PrimFunc) -> None:
        """A constant `kiln_sig_<name>` holding the parameters' text (`linker.signature_text`): loading a
        library checks its header against it, read from the object's symbol table, never executed."""
        text = linker.signature_text((b.name, b.dtype, [dim_text(d) for d in b.shape])
                                  for b in func.params).encode()
        ty = ir.ArrayType(ir.IntType(8), len(text))
        sig = ir.GlobalVariable(self.module, ty, linker.signature_symbol(func.name))
        sig.global_constant = True
        sig.initializer = ir.Constant(ty, bytearray(text))

    def _function(self, name: str, fnty: ir.FunctionType, internal: bool) -> ir.Function:
        fn = ir.Function(self.module, fnty, name)
        for a in fn.args:
            if a.type == PTR:
                a.add_attribute("noalias")
        if internal:
            fn.linkage = "internal"
        attrs = fn.attributes
        attrs.add("nounwind")
        # String attributes are not in llvmlite's list of known ones; they print as given.
        set.add(attrs, f'"target-cpu"="{self.cpu}"')
        if self.features:
            set.add(attrs, f'"target-features"="{self.features}"')
        if self.vector_bits == 512:
            set.add(attrs, '"prefer-vector-width"="512"')
        return fn

    # -- statements ------------------------------------------------------------------------

    def stmt(self, s: Stmt) -> None:
        """Emits statement `s` at the builder's position."""
        b = self.f.builder
        if isinstance(s, SeqStmt):
            for c in s.stmts:
                self.stmt(c)
        elif isinstance(s, BufferStore):
            value = self.expr(s.value)
            if s.buffer.dtype == "bool":
                value = b.zext(value, I8)
            elif s.buffer.dtype in NARROW_FLOATS:
                value = self._narrow_bits(value, s.buffer.dtype)
            ptr = self._address(s.buffer, s.indices[0])
            b.store(value, ptr, align=_TYPES[s.buffer.dtype][2] // 8)
        elif isinstance(s, For):
            self._for(s)
        elif isinstance(s, Allocate):
            self._allocate(s)
        elif isinstance(s, IfThenElse):
            cond = self.expr(s.cond)
            if s.else_case is None:
                with b.if_then(cond):
                    self.stmt(s.then_case)
            else:
                with b.if_else(cond) as (then, otherwise):
                    with then:
                        self.stmt(s.then_case)
                    with otherwise:
                        self.stmt(s.else_case)
        elif isinstance(s, LetStmt):
            chain = let_chain(s)  # in a loop: a fused kernel's shared values are a long chain of lets
            for let in chain:
                self.f.vars[id(let.var)] = self.expr(let.value)
            self.stmt(chain[-1].body)
            for let in chain:
                del self.f.vars[id(let.var)]  # out of scope: a later parallel loop must not capture it
        elif isinstance(s, Evaluate):
            self.expr(s.value)
        else:
            raise CodegenError(f"the llvm back end cannot compile statement {type(s).__name__}")

    def _allocate(self, s: Allocate) -> None:
        """A temporary: on the stack up to `STACK_LIMIT` bytes of constant size, else on the heap."""
        buf = s.buffer
        (size,) = buf.shape
        if buf.scope not in ("local", "global"):
            raise CodegenError(f"the llvm back end cannot allocate scope {buf.scope!r} ({buf.name})")
        width = _TYPES[buf.dtype][2] // 8
        if not on_heap(buf):
            assert isinstance(size, IntImm)
            ptr = self.f.alloca(_mem(buf.dtype), max(size.value, 1), buf.name)
            ptr.align = 64
            self.f.bufs[id(buf)] = ptr
            self.stmt(s.body)
            del self.f.bufs[id(buf)]
            return
        b = self.f.builder
        count, overflow = self._size_i64(size)
        nbytes, over = self._checked(b, "mul", b.select(b.icmp_signed(">", count, I64(1)), count, I64(1)),
                                     I64(width))
        nbytes, over2 = self._checked(b, "add", nbytes, I64(63))
        nbytes = b.and_(nbytes, I64(-64))  # aligned_alloc wants a multiple of the alignment
        bad = b.or_(b.or_(overflow, over), b.or_(over2, b.icmp_signed("<", count, I64(0))))
        # a size that overflows or is negative asks for 2**64 - 64 bytes, which fails like any other
        ptr = llvm_math.intrinsic(b, "aligned_alloc", PTR, [I64(64), b.select(bad, I64(-64), nbytes)])
        ok = self.f.fn.append_basic_block(f"{buf.name}.allocated")
        fail = self.f.fn.append_basic_block(f"{buf.name}.out_of_memory")
        b.cbranch(b.icmp_unsigned("==", ptr, ir.Constant(PTR, None)), fail, ok)
        b.position_at_end(fail)
        self._leave_failed()
        b.position_at_end(ok)
        self.f.bufs[id(buf)] = ptr
        self.f.heap.append(ptr)
        self.stmt(s.body)
        self.f.heap.pop()
        del self.f.bufs[id(buf)]
        llvm_math.intrinsic(self.f.builder, "free", ir.VoidType(), [ptr])

    @staticmethod
    def _checked(b: ir.IRBuilder, op: str, x: ir.Value, y: ir.Value) -> tuple[ir.Value, ir.Value]:
        """x op y in int64 and whether it overflowed (llvm.s{op}.with.overflow)."""
        ty = ir.LiteralStructType([I64, I1])
        pair = llvm_math.intrinsic(b, f"llvm.s{op}.with.overflow.i64", ty, [x, y])
        return b.extract_value(pair, 0), b.extract_value(pair, 1)

    def _size_i64(self, e: PrimExpr) -> tuple[ir.Value, ir.Value]:
        """An allocation size in int64 and whether computing it overflowed: sums and products of
        sizes are recomputed in int64 with overflow checks (in their own int32 they could wrap
        to a small size, and the kernel would then write past its temporary)."""
        b = self.f.builder
        if isinstance(e, (Add, Sub, Mul)):
            (x, ox), (y, oy) = self._size_i64(e.a), self._size_i64(e.b)
            v, o = self._checked(b, {Add: "add", Sub: "sub", Mul: "mul"}[type(e)], x, y)
            return v, b.or_(o, b.or_(ox, oy))
        if isinstance(e, Cast) and e.dtype == "int64" and e.value.dtype in ("int32", "int64"):
            return self._size_i64(e.value)
        return self._int_resize(self.expr(e), e.dtype, "int64"), ir.Constant(I1, 0)

    def _leave_failed(self) -> None:
        """Frees this function's live heap temporaries and returns the out-of-memory status (from a
        parallel body: sets the shared flag, which the launching function then returns)."""
        b = self.f.builder
        for p in reversed(self.f.heap):
            llvm_math.intrinsic(b, "free", ir.VoidType(), [p])
        if self.f.failed is not None:
            b.store_atomic(I32(STATUS_OUT_OF_MEMORY), self.f.failed, "monotonic", 4)
            b.ret_void()
        else:
            b.ret(I32(STATUS_OUT_OF_MEMORY))

    def _address(self, buf: Any, index: PrimExpr, inbounds: bool = True) -> ir.Value:
        ptr = self.f.bufs.get(id(buf))
        if ptr is None:
            raise CodegenError(f"buffer {buf.name} is used outside its allocation or is not a parameter")
        idx = self._int_resize(self.expr(index), index.dtype, "int64")
        # llvmlite types an alloca's pointer (T*) but not a parameter's (opaque ptr)
        etype = _mem(buf.dtype) if ptr.type.is_opaque else None
        return self.f.builder.gep(ptr, [idx], inbounds=inbounds, source_etype=etype)

    def _for(self, s: For) -> None:
        if s.kind is ForKind.THREAD_BINDING:
            raise CodegenError(f"loop {s.loop_var.name} is bound to {s.thread_tag}: a GPU loop on an llvm target")
        if s.kind is ForKind.UNROLLED and isinstance(s.extent, IntImm) and s.extent.value <= _UNROLL_LIMIT \
                and isinstance(s.min, IntImm):
            for k in range(s.extent.value):
                self.f.vars[id(s.loop_var)] = ir.Constant(_reg(s.loop_var.dtype), s.min.value + k)
                self.stmt(s.body)
            self.f.vars.pop(id(s.loop_var), None)
            return
        if s.kind is ForKind.PARALLEL and not self.f.in_parallel and self.num_threads > 1:
            self._parallel(s)
            return
        dot = llvm_x86.match_dot_loop(s) if self.vnni else None
        if dot is not None:
            llvm_x86.emit_dot_loop(self, s, dot)
            return
        width = self._vector_width(s)
        if width and isinstance(s.min, IntImm) and isinstance(s.extent, IntImm) and s.extent.value % width:
            # whole vectors, then the rest as a loop of its own, of narrower vectors: LLVM leaves the
            # remainder of a loop of forced width to scalar code (8 of a padded row's 56 columns; a
            # strided copy even keeps its last whole vector scalar, to read no further than it must)
            main = s.extent.value - s.extent.value % width
            self._for(attrs.evolve(s, extent=IntImm(s.extent.dtype, main)))
            self._for(attrs.evolve(s, min=IntImm(s.min.dtype, s.min.value + main),
                                   extent=IntImm(s.extent.dtype, s.extent.value - main)))
            return
        begin = self.expr(s.min)
        end = self.f.builder.add(begin, self.expr(s.extent))
        self._loop(s.loop_var, begin, end, s.body, self._loop_md(s))

    def _vector_width(self, s: For) -> int | None:
        """The lanes of vectorized loop `s` (at most its constant extent, a power of two); None if it is
        no vectorized loop or one of fewer than 2 lanes."""
        if s.kind is not ForKind.VECTORIZED:
            return None
        width = self.vector_bits // _widest_store(s.body)
        if isinstance(s.extent, IntImm):
            width = min(width, 1 << max(s.extent.value, 1).bit_length() - 1)
        period = llvm_lanes.lane_period(s.body, s.loop_var)
        if period is not None:  # LLVM 22 misreads `i % 2^k` as consecutive across more lanes (llvm_lanes)
            width = min(width, period)
        return width if width > 1 else None

    def _loop_md(self, s: For) -> ir.values.MDValue | None:
        m = self.module
        if s.kind is ForKind.UNROLLED:
            return _LoopMD(m, [m.add_metadata(["llvm.loop.unroll.enable"])])
        width = self._vector_width(s)
        if width is None:
            return None
        # With unroll.disable the loop vectorizer takes the loop as it is, one vector per iteration: kiln's
        # tiles need that (without it LLVM unrolled a dense's 16-lane loops first and made gathers of them,
        # 2.2x slower). But LLVM 22 then read an operand indexed by a division of the lane variable as
        # consecutive ((16,2,4,4) + (2,1,4): B[j, 0, i % 4] went wrong): such loops are only kept from
        # runtime unrolling. The cause, the loop vectorizer's reading of a masked `i % 2^k`, also strikes
        # loops too big to unroll; their widths are capped and interleaving is off (llvm_lanes).
        unroll = "llvm.loop.unroll.runtime.disable" if llvm_lanes.divides(s.body, s.loop_var) \
            else "llvm.loop.unroll.disable"
        props = [m.add_metadata(["llvm.loop.vectorize.enable", ir.Constant(I1, 1)]),
                 m.add_metadata(["llvm.loop.vectorize.width", ir.Constant(I32, width)]),
                 m.add_metadata([unroll]),
                 m.add_metadata(["llvm.loop.vectorize.followup_vectorized",
                                 m.add_metadata(["llvm.loop.isvectorized"])])]
        if llvm_lanes.lane_period(s.body, s.loop_var) is not None:
            # interleaved vectors of a masked `i % 2^k` are as wrong as wider ones (llvm_lanes)
            props.append(m.add_metadata(["llvm.loop.interleave.count", ir.Constant(I32, 1)]))
        return _LoopMD(m, props)

    def _loop(self, var: Var, begin: ir.Value, end: ir.Value, body: Stmt, md: ir.values.MDValue | None) -> None:
        b, fn = self.f.builder, self.f.fn
        pre = b.block
        header = fn.append_basic_block(f"{var.name}.header")
        body_block = fn.append_basic_block(f"{var.name}.body")
        exit_block = fn.append_basic_block(f"{var.name}.exit")
        b.branch(header)
        b.position_at_end(header)
        phi = b.phi(begin.type, name=var.name)
        phi.add_incoming(begin, pre)
        signed = _signed(var.dtype)
        cond = b.icmp_signed("<", phi, end) if signed else b.icmp_unsigned("<", phi, end)
        b.cbranch(cond, body_block, exit_block)
        b.position_at_end(body_block)
        self.f.vars[id(var)] = phi
        self.stmt(body)
        nxt = b.add(phi, ir.Constant(begin.type, 1), flags=("nsw",) if signed else ("nuw",))
        phi.add_incoming(nxt, b.block)
        br = b.branch(header)
        if md is not None:
            br.set_metadata("llvm.loop", md)
        b.position_at_end(exit_block)
        del self.f.vars[id(var)]

    def _parallel(self, s: For) -> None:
        """Outlines loop `s` into a body function over [lo, hi) and a trampoline that kiln's pool
        (`runtime.pool`) calls per chunk with the packed values the body captures."""
        outer = self.f
        b = outer.builder
        k = self._par_count
        self._par_count += 1
        base = f"{outer.fn.name}.par{k}"
        begin = self._int_resize(self.expr(s.min), s.min.dtype, "int64")
        end = b.add(begin, self._int_resize(self.expr(s.extent), s.extent.dtype, "int64"))
        var_items = list(outer.vars.items())
        buf_items = list(outer.bufs.items())
        failed = outer.alloca(I32, None, f"{base}.failed")
        b.store(I32(STATUS_OK), failed)
        captured = [v for _, v in var_items] + [p for _, p in buf_items] + [failed]
        fields = [v.type for v in captured]
        struct_ty = ir.LiteralStructType(fields)
        data = outer.alloca(struct_ty, None, f"{base}.data")
        for i, value in enumerate(captured):
            b.store(value, b.gep(data, [I32(0), I32(i)], inbounds=True))

        # The body: loop over [lo, hi) with the captured values as (noalias) parameters.
        body_fn = self._function(f"{base}.body", ir.FunctionType(ir.VoidType(), [I64, I64, *fields]), True)
        self.f = inner = _Func(body_fn)
        inner.in_parallel = True
        inner.failed = body_fn.args[-1]
        for i, (key, _) in enumerate(var_items):
            inner.vars[key] = body_fn.args[2 + i]
        for i, (key, _) in enumerate(buf_items):
            inner.bufs[key] = body_fn.args[2 + len(var_items) + i]
        lo = self._int_resize(body_fn.args[0], "int64", s.loop_var.dtype)
        hi = self._int_resize(body_fn.args[1], "int64", s.loop_var.dtype)
        if isinstance(s.min, IntImm) and isinstance(s.extent, IntImm):
            # The pool's chunk lies inside the loop; clamped to it, the loop variable has a known range,
            # so LLVM can prove that int32 index arithmetic on it does not wrap (without the clamps it
            # vectorized the inner loops behind runtime overflow checks, with scalar loops beside them
            # that kept a tile's accumulators in memory).
            ib = inner.builder
            first = ir.Constant(lo.type, s.min.value)
            last = ir.Constant(hi.type, s.min.value + s.extent.value)
            lo = ib.select(ib.icmp_signed("<", lo, first), first, lo)
            hi = ib.select(ib.icmp_signed(">", hi, last), last, hi)
        self._loop(s.loop_var, lo, hi, s.body, None)
        inner.builder.ret_void()

        # The trampoline: one chunk [lo, hi), from the packed values.
        tramp = self._function(base, ir.FunctionType(ir.VoidType(), [PTR, I64, I64]), True)
        self.f = t = _Func(tramp)
        tb = t.builder
        vals = [tb.load(tb.gep(tramp.args[0], [I32(0), I32(i)], inbounds=True, source_etype=struct_ty), typ=ty)
                for i, ty in enumerate(fields)]
        tb.call(body_fn, [tramp.args[1], tramp.args[2], *vals])
        tb.ret_void()

        self.f = outer
        pool_for = self.module.globals.get(pool.PARALLEL_FOR) or ir.Function(
            self.module, ir.FunctionType(ir.VoidType(), [PTR, PTR, I64, I64, I32]), pool.PARALLEL_FOR)
        b.call(pool_for, [tramp, data, begin, end, I32(self.num_threads)])
        fail = outer.fn.append_basic_block(f"{base}.out_of_memory")
        done = outer.fn.append_basic_block(f"{base}.done")
        b.cbranch(b.icmp_signed("!=", b.load(failed), I32(STATUS_OK)), fail, done)
        b.position_at_end(fail)
        self._leave_failed()
        b.position_at_end(done)

    # -- expressions ---------------------------------------------------------------------

    def expr(self, e: PrimExpr) -> ir.Value:
        """The value of `e` at the builder's position."""
        b = self.f.builder
        if isinstance(e, IntImm):
            # unsigned constants are written as their bit pattern (2**63 + 5 as i64 is -9223372036854775803)
            width = _reg(e.dtype).width
            bits = int(e.value) & ((1 << width) - 1)
            return ir.Constant(_reg(e.dtype), bits - (1 << width) if width > 1 and bits >> (width - 1) else bits)
        if isinstance(e, FloatImm):
            if e.dtype in NARROW_FLOATS:  # a float16 constant holds a float16 value, like numpy's
                with np.errstate(over="ignore"):
                    return ir.Constant(llvm_math.F32, float(DataType.of(e.dtype).numpy().type(e.value)))
            return ir.Constant(_reg(e.dtype), e.value)
        if isinstance(e, Var):
            v = self.f.vars.get(id(e))
            if v is None:
                raise CodegenError(f"variable {e.name} is used where it is not bound")
            return v
        if isinstance(e, BufferLoad):
            ptr = self._address(e.buffer, e.indices[0])
            v = b.load(ptr, typ=_mem(e.dtype), align=_TYPES[e.dtype][2] // 8)
            if e.dtype in NARROW_FLOATS:
                return self._narrow_to_float(v, e.dtype)
            return b.icmp_unsigned("!=", v, I8(0)) if e.dtype == "bool" else v
        if isinstance(e, BinaryOp):
            return self._binary(e)
        if isinstance(e, Not):
            return b.not_(self.expr(e.a))
        if isinstance(e, Cast):
            return self._cast(self.expr(e.value), e.value.dtype, e.dtype)
        if isinstance(e, Select):
            return b.select(self.expr(e.cond), self.expr(e.true_value), self.expr(e.false_value))
        if isinstance(e, Call):
            return self._call(e)
        raise CodegenError(f"the llvm back end cannot compile expression {type(e).__name__}")

    def _binary(self, e: BinaryOp) -> ir.Value:
        b = self.f.builder
        dt = e.a.dtype
        x, y = self.expr(e.a), self.expr(e.b)
        if type(e) in _CMP:
            op = _CMP[type(e)]
            if is_float(dt):
                return b.fcmp_unordered(op, x, y) if op == "!=" else b.fcmp_ordered(op, x, y)
            return b.icmp_signed(op, x, y) if _signed(dt) else b.icmp_unsigned(op, x, y)
        if isinstance(e, And):
            return b.and_(x, y)
        if isinstance(e, Or):
            return b.or_(x, y)
        if is_float(dt):
            return self._float_binary(e, x, y)
        return llvm_int.binary(self.f.builder, e, x, y)

    def _float_binary(self, e: BinaryOp, x: ir.Value, y: ir.Value) -> ir.Value:
        b = self.f.builder
        sfx = "f32" if x.type == llvm_math.F32 else "f64"
        simple: dict[type, Callable[..., ir.Value]] = {Add: b.fadd, Sub: b.fsub, Mul: b.fmul}
        if type(e) in simple:
            return simple[type(e)](x, y, flags=_FLOAT_FLAGS)
        if isinstance(e, (Min, Max)):
            name = "minimum" if isinstance(e, Min) else "maximum"  # NaN-propagating, like numpy
            return llvm_math.intrinsic(b, f"llvm.{name}.{sfx}", x.type, [x, y])
        q = b.fdiv(x, y, flags=("contract",))
        if isinstance(e, Div):
            return q
        fq = llvm_math.intrinsic(b, f"llvm.floor.{sfx}", x.type, [q])
        if isinstance(e, FloorDiv):
            return fq
        if isinstance(e, FloorMod):
            return b.fsub(x, b.fmul(fq, y))
        raise CodegenError(f"unknown float operation {type(e).__name__}")

    def _call(self, e: Call) -> ir.Value:
        b = self.f.builder
        if e.name == "prefetch":  # of a (read, high-locality, data) cache line; never loads, may point past the end
            (ld,) = e.args
            assert isinstance(ld, BufferLoad)
            ptr = self._address(ld.buffer, ld.indices[0], inbounds=False)
            i32 = [ir.Constant(I32, v) for v in (0, 3, 1)]
            llvm_math.intrinsic(b, "llvm.prefetch.p0", ir.VoidType(), [ptr, *i32])
            return ir.Constant(I32, 0)
        if e.name == ALLREDUCE:  # only under loops bound to GPU threads, which this back end refuses first
            raise CodegenError(f"{e.name}: a reduction across GPU threads (a reduction axis bound to threadIdx.x) "
                               "compiles for cuda targets only")
        dt = e.args[0].dtype
        if e.name == "reinterpret":
            return self._reinterpret(self.expr(e.args[0]), dt, e.dtype)
        if e.name == "pow" and is_float(dt) and isinstance(e.args[1], FloatImm) and e.args[1].value in _POW_BY_PRODUCT:
            # x**2, x**3 (GELU's tanh form), x**4 as products: llvm.pow is a scalar libm call that stops the
            # loop vectorizing (GPT-2's GELU ran at 12 ns an element)
            x = self.expr(e.args[0])
            out = x
            for _ in range(int(e.args[1].value) - 1):
                out = b.fmul(out, x)
            return out
        args = [self.expr(a) for a in e.args]
        if is_float(dt):
            # float16 and bfloat16 are in float32 registers: float32 math
            return llvm_math.emit_float_call(b, e.name, args, scalef=self.avx512)
        if e.name == llvm_x86.DOT4:
            return llvm_x86.dot4(b, *args)
        if e.name == "abs":
            return b.select(b.icmp_signed("<", args[0], ir.Constant(args[0].type, 0)),
                            b.sub(ir.Constant(args[0].type, 0), args[0]), args[0]) if _signed(dt) else args[0]
        if e.name == "isnan":
            return ir.Constant(I1, 0)
        if e.name in ("floor", "ceil", "round"):
            return args[0]
        raise CodegenError(f"intrinsic {e.name} of integer type {dt}: cast to a float type first")

    # -- conversions -----------------------------------------------------------------------

    def _int_resize(self, v: ir.Value, src: str, dst: str) -> ir.Value:
        return self._cast(v, src, dst)

    def _half_bits(self, v: ir.Value) -> ir.Value:
        """The float16 bits (i16) of float32/float64 `v`, rounded to nearest even."""
        b = self.f.builder
        if self.f16c and v.type == llvm_math.F32:  # vcvtps2ph; double -> half has no F16C instruction
            return b.bitcast(b.fptrunc(v, F16), llvm_math.I16)
        return llvm_math.float_to_half_bits(b, v)

    def _narrow_bits(self, v: ir.Value, dtype: str) -> ir.Value:
        """The float16 or bfloat16 bits (i16) of float32/float64 `v`, rounded to nearest even."""
        if dtype == "bfloat16":
            return llvm_math.float_to_bfloat16_bits(self.f.builder, v)
        return self._half_bits(v)

    def _narrow_to_float(self, h: ir.Value, dtype: str) -> ir.Value:
        """The float32 value of float16 or bfloat16 bits `h` (exact)."""
        if dtype == "bfloat16":
            return llvm_math.bfloat16_bits_to_float(self.f.builder, h)
        return self._half_to_float(h)

    def _reinterpret(self, v: ir.Value, src: str, dst: str) -> ir.Value:
        """The bits of `v` (a `src` register) read as `dst`; float16 and bfloat16 are float registers
        around their i16 bits."""
        if src in NARROW_FLOATS:
            return self._narrow_bits(v, src)  # the int16/uint16 register is those bits
        if dst in NARROW_FLOATS:
            return self._narrow_to_float(v, dst)
        return self.f.builder.bitcast(v, _reg(dst))

    def _half_to_float(self, h: ir.Value) -> ir.Value:
        """The float32 value of float16 bits `h` (exact)."""
        b = self.f.builder
        if self.f16c:  # vcvtph2ps
            return b.fpext(b.bitcast(h, F16), llvm_math.F32)
        return llvm_math.half_bits_to_float(b, h)

    def _saturating_int(self, v: ir.Value, dst: str) -> ir.Value:
        """Float `v` as integer dtype `dst`, saturated at its bounds, NaN as 0 (`llvm.fptosi.sat`'s
        meaning). Written as clamps, a plain conversion and selects: x86 has no vector form of the
        saturating intrinsic and scalarized it, 16 conversions per vector."""
        b = self.f.builder
        to = _reg(dst)
        signed = _signed(dst)
        lo, top = (-(1 << (to.width - 1)), 1 << (to.width - 1)) if signed else (0, 1 << to.width)
        np_float = np.float32 if v.type == llvm_math.F32 else np.float64
        below_top = float(np.nextafter(np_float(top), np_float(0)))  # the largest float under 2**bits
        low, high = ir.Constant(v.type, float(lo)), ir.Constant(v.type, below_top)
        clamped = b.select(b.fcmp_ordered("<", v, low), low, v)
        clamped = b.select(b.fcmp_ordered(">", clamped, high), high, clamped)
        nan = b.fcmp_unordered("uno", v, v)
        clamped = b.select(nan, ir.Constant(v.type, 0.0), clamped)  # a NaN would make the conversion poison
        out = b.fptosi(clamped, to) if signed else b.fptoui(clamped, to)
        if below_top < top - 1:  # floats in (below_top, top) do not exist: v >= top saturates to the max
            out = b.select(b.fcmp_ordered(">=", v, ir.Constant(v.type, float(top))), ir.Constant(to, top - 1), out)
        return out

    def _cast(self, v: ir.Value, src: str, dst: str) -> ir.Value:
        b = self.f.builder
        if src == dst:
            return v
        if dst in NARROW_FLOATS:  # round to half (bfloat16) precision, held in a float register
            if not is_float(src):
                # float16: exact below 2**24; from there on float32 and float16 both overflow to inf,
                # so rounding through float32 is rounding once. bfloat16: through float32, as ml_dtypes.
                v = b.uitofp(v, llvm_math.F32) if src == "bool" or not _signed(src) else b.sitofp(v, llvm_math.F32)
            return self._narrow_to_float(self._narrow_bits(v, dst), dst)
        if src in NARROW_FLOATS:
            src = "float32"
            if dst == src:
                return v
        to = _reg(dst)
        if dst == "bool":
            return b.fcmp_unordered("!=", v, ir.Constant(v.type, 0.0)) if is_float(src) \
                else b.icmp_unsigned("!=", v, ir.Constant(v.type, 0))
        if is_float(src) and is_float(dst):
            return b.fpext(v, to) if _TYPES[dst][2] > _TYPES[src][2] else b.fptrunc(v, to)
        if is_float(src):
            return self._saturating_int(v, dst)
        if is_float(dst):
            return b.sitofp(v, to) if _signed(src) else b.uitofp(v, to)
        if to.width == v.type.width:
            return v
        if to.width < v.type.width:
            return b.trunc(v, to)
        return b.sext(v, to) if _signed(src) else b.zext(v, to)


_POW_BY_PRODUCT = (1.0, 2.0, 3.0, 4.0)  # exponents of pow emitted as multiplications (1 to 3 roundings)


def _widest_store(s: Stmt) -> int:
    """The widest element (bits) stored in `s`; 32 when nothing is stored."""
    widest = 0
    stack = [s]
    while stack:
        s = stack.pop()
        if isinstance(s, BufferStore):
            widest = max(widest, _TYPES.get(s.buffer.dtype, (None, None, 32))[2])
        elif isinstance(s, SeqStmt):
            stack.extend(s.stmts)
        elif isinstance(s, (For, Allocate, LetStmt)):
            stack.append(s.body)
        elif isinstance(s, IfThenElse):
            stack.append(s.then_case)
            if s.else_case is not None:
                stack.append(s.else_case)
    return widest or 32


def emit_llvm_ir(func: PrimFunc, target: Target) -> str:
    """The (unoptimized) LLVM IR text of `func` for llvm target `target`."""
    return CodeGenLLVM(target).compile(func)
