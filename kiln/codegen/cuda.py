"""Loop IR to CUDA C: one `extern "C" __global__` kernel per thread-bound loop nest.

`generate(func, target)` returns a `CudaCode` (`kiln.runtime.cuda_module`): the
source text, and per kernel its name, launch shape and arguments, which
`kiln.runtime.cuda_module` needs to launch it. `cuda_host` splits the function
into kernels and workspaces, finds the launch shapes and places barriers; this
module renders each kernel, table-driven (dtype -> C type, op -> C operator,
intrinsic -> CUDA math function).

The kernel ABI: one pointer per buffer the kernel touches (parameters in the
PrimFunc's order, then workspaces), `const` where it only reads it, all
`__restrict__` (the runtime refuses overlapping arrays); then one `long long`
per symbolic size it uses. Buffers are flattened to 1-D row-major
(`kiln.tir.flatten`). `__launch_bounds__` is the block size.

Threads: a bound loop becomes its index (`const int i = (int)threadIdx.x;`),
guarded with `if` where its extent is smaller than the launch. Loop IR is
sequential, so a statement outside every loop bound to some axis runs once:
it is emitted under `if (threadIdx.y == 0)` (for each such axis of more than
one index), and reductions into global memory stay race-free whatever the
schedule binds. A barrier under a thread-dependent condition or loop is
refused (it would hang the block). Loops not bound to threads are plain
`for` loops; UNROLLED gets `#pragma unroll`, and so does a VECTORIZED loop
unless it becomes vector loads and stores (`kiln.codegen.cuda_vector`);
PARALLEL runs serially in each thread.

Memory: `Allocate` in "shared" scope becomes a slice of the kernel's dynamic
shared memory (`extern __shared__`, 16-byte aligned slices; the module raises
the kernel's limit above 48 KiB when it needs more, up to the target's
`max-shared-memory-per-block`); "local" becomes a per-thread array (constant
size); "global" is allowed at the top level only (a workspace).

Numerics, and why:
- Integer `//`, `%` floor (as numpy), `/` truncates; dividing by 0 gives 0 (as
  the llvm back end: never a trap, never undefined). A floor division by a
  positive constant of an index the loop bounds prove non-negative is plain C
  `/` and `%`. Float `min`/`max` propagate NaN (as numpy).
- Float to integer casts saturate and NaN becomes 0 (PTX `cvt.rzi` does that
  for 32/64-bit results; narrower ones are clamped explicitly), as in the llvm
  back end. int8/int16/uint8/uint16 arithmetic wraps (results are cast back).
  Shifts out of [0, width) are defined as in the llvm back end (`cuda_ops`).
- float16 values are `__half` (cuda_fp16.h); arithmetic and math on them is
  done in float32 and rounded once per operation, which for +, -, *, / and
  sqrt gives the correctly rounded half result (float32 has more than twice
  the precision). Only the conversions `__float2half`, `__double2half` and
  `__half2float` are used, and the bit casts `__half_as_short`, `__short_as_half`
  and their unsigned forms, so `kiln.codegen.nvrtc` can supply them itself where
  no CUDA toolkit headers are installed. bfloat16 values are kiln's own
  `kiln_bf16` (cuda_types.BF16_PRELUDE: its bits, widened by a shift and
  rounded to nearest even in integer arithmetic), computed in float32 the same way.
- Math intrinsics are CUDA's full-precision functions (expf 2 ulp, logf 1,
  tanhf 2, erff 2, sqrtf correctly rounded): the fast `__expf`/`__logf` have
  errors growing with |x| (hundreds of ulp for softmax-sized arguments), too
  far from the llvm back end's 1-2 ulp. The one fast intrinsic is
  `__fdividef` in sigmoid, whose denominator `1 + exp(-x)` is at least 1:
  it is within 2 ulp there and returns 0 once `exp(-x)` overflows, which is
  the correctly rounded result.
- Indices are computed in int32 where the buffer has a constant size below
  2**31 elements (an in-bounds offset then fits), else in int64.

Cross-thread reductions (`kiln.warp_allreduce`) are warp shuffles, and shared
memory across warps: `kiln.codegen.cuda_allreduce`. Tensor-core products
(`kiln.mma_m16n8k16`) are fragment loads and one `mma.sync`: `kiln.codegen.cuda_mma`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from contextlib import ExitStack

from kiln.codegen import cuda_ops, cuda_types
from kiln.codegen.cuda_allreduce import emit_allreduce, scratch_bytes
from kiln.codegen.cuda_host import (
    SYNC_NAME,
    Launch,
    bound_tags,
    has_sync,
    insert_syncs,
    scan_launch,
    split_host,
    syncthreads,
)
from kiln.codegen.cuda_mma import MMA_PRELUDE, MmaRun, calls
from kiln.codegen.cuda_types import C_TYPES, NARROW
from kiln.codegen.cuda_types import float_literal as _float_literal
from kiln.codegen.cuda_types import int_literal as _int_literal
from kiln.codegen.cuda_vector import ASYNC_PRELUDE, INT32_MAX, emit_vectorized, with_async_waits
from kiln.codegen.cuda_vector import narrow_index as _narrow_index
from kiln.codegen.jit import CodegenError
from kiln.ir.dtype import DataType
from kiln.runtime.cuda_module import CudaCode, KernelArg, KernelSpec
from kiln.target import Target, TDeviceType
from kiln.tir.allreduce import ALLREDUCE
from kiln.tir.expr import (
    EQ,
    GE,
    GT,
    LE,
    LT,
    NE,
    SHIFTS,
    Add,
    And,
    BinaryOp,
    Buffer,
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
from kiln.tir.functor import Node, let_chain, post_order_visit, used_vars
from kiln.tir.mma import MMA
from kiln.tir.simplify import Analyzer
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

__all__ = [
    "C_TYPES",
    "CodeGenCUDA",
    "generate",
    "supported_dtypes",
    "syncthreads",
]

# -- tables ----------------------------------------------------------------------------------

_C_OPS: dict[type, str] = {Add: "+", Sub: "-", Mul: "*", EQ: "==", NE: "!=", LT: "<", LE: "<=", GT: ">", GE: ">=",
                           And: "&&", Or: "||", **cuda_ops.BIT_OPS}
# intrinsic -> (float32 function, float64 function); float16 goes through float32.
_MATH: dict[str, tuple[str, str]] = {
    "exp": ("expf", "exp"), "log": ("logf", "log"), "sqrt": ("sqrtf", "sqrt"), "rsqrt": ("rsqrtf", "rsqrt"),
    "tanh": ("tanhf", "tanh"), "erf": ("erff", "erf"), "pow": ("powf", "pow"), "floor": ("floorf", "floor"),
    "ceil": ("ceilf", "ceil"), "round": ("rintf", "rint"),  # rint: half to even, like numpy
    "abs": ("fabsf", "fabs"), "sin": ("sinf", "sin"), "cos": ("cosf", "cos"), "fma": ("fmaf", "fma"),
}
_STATIC_SHARED_LIMIT = 48 * 1024  # the default limit of shared memory per block

_KEYWORDS = frozenset(
    [
        "alignas", "alignof", "asm", "auto", "bool", "break", "case", "catch", "char", "class", "const", "constexpr",
        "continue", "decltype", "default", "delete", "do", "double", "else", "enum", "explicit", "extern", "false",
        "float", "for", "friend", "goto", "if", "inline", "int", "long", "mutable", "namespace", "new", "noexcept",
        "nullptr", "operator", "private", "protected", "public", "register", "restrict", "return", "short", "signed",
        "sizeof", "static", "struct", "switch", "template", "this", "throw", "true", "try", "typedef", "typename",
        "union", "unsigned", "using", "virtual", "void", "volatile", "while", "threadIdx", "blockIdx", "blockDim",
        "gridDim", "warpSize", "main", "min", "max", "isnan",
    ]
)

_PRELUDE = r"""// Integer division as the loop IR defines it: 0 for a zero divisor (never a trap);
// floor division and modulo round toward minus infinity (as numpy).
template <typename T> __device__ __forceinline__ T kiln_div(T a, T b) { return b == 0 ? T(0) : T(a / b); }
template <typename T> __device__ __forceinline__ T kiln_floordiv(T a, T b) {
  if (b == 0) return T(0);
  T q = T(a / b), r = T(a % b);
  return (r != 0 && ((r < 0) != (b < 0))) ? T(q - 1) : q;
}
template <typename T> __device__ __forceinline__ T kiln_floormod(T a, T b) {
  if (b == 0) return T(0);
  T r = T(a % b);
  return (r != 0 && ((r < 0) != (b < 0))) ? T(r + b) : r;
}
// min/max; on floats NaN-propagating (as numpy), unlike fminf/fmaxf.
template <typename T> __device__ __forceinline__ T kiln_min(T a, T b) { return b < a ? b : a; }
template <typename T> __device__ __forceinline__ T kiln_max(T a, T b) { return a < b ? b : a; }
template <typename T> __device__ __forceinline__ T kiln_abs(T a) { return a < 0 ? T(-a) : a; }
// Float modulo as the llvm back end: x - floor(x / y) * y.
__device__ __forceinline__ float kiln_floormod(float a, float b) { return a - floorf(a / b) * b; }
__device__ __forceinline__ double kiln_floormod(double a, double b) { return a - floor(a / b) * b; }
template <> __device__ __forceinline__ float kiln_min<float>(float a, float b) {
  return (isnan(a) || isnan(b)) ? a + b : fminf(a, b);
}
template <> __device__ __forceinline__ float kiln_max<float>(float a, float b) {
  return (isnan(a) || isnan(b)) ? a + b : fmaxf(a, b);
}
template <> __device__ __forceinline__ double kiln_min<double>(double a, double b) {
  return (isnan(a) || isnan(b)) ? a + b : fmin(a, b);
}
template <> __device__ __forceinline__ double kiln_max<double>(double a, double b) {
  return (isnan(a) || isnan(b)) ? a + b : fmax(a, b);
}
// The sum over the 4 bytes of (a's byte, unsigned) * (b's byte, signed): tir's dot4_u8i8.
__device__ __forceinline__ int kiln_dot4_u8i8(int a, int b) {
  int s = 0;
  for (int j = 0; j < 32; j += 8) s += (int)(((unsigned)a >> j) & 255u) * (int)(signed char)(((unsigned)b >> j) & 255u);
  return s;
}
// A float converted to a narrow integer saturates (NaN to 0), as the llvm back end's fptosi.sat.
template <typename T, typename F> __device__ __forceinline__ T kiln_saturate(F v, int lo, int hi) {
  return isnan(v) ? T(0) : (v <= F(lo) ? T(lo) : (v >= F(hi) ? T(hi) : T(v)));
}
"""


def supported_dtypes() -> tuple[str, ...]:
    """The dtypes the CUDA back end compiles."""
    return tuple(C_TYPES)


# -- names ------------------------------------------------------------------------------------


class _CNames:
    """C identifiers for vars and buffers: sanitized, not keywords, unique within a kernel."""

    def __init__(self) -> None:
        self.names: dict[int, str] = {}
        self.used: set[str] = set()

    def __call__(self, obj: Var | Buffer) -> str:
        key = id(obj)
        if key not in self.names:
            self.names[key] = self.fresh(obj.name)
        return self.names[key]

    def fresh(self, base: str) -> str:
        """A new identifier like `base`."""
        base = re.sub(r"\W", "_", base, flags=re.ASCII) or "v"
        if base[0].isdigit() or base in _KEYWORDS or base.startswith(("kiln_", "__")):
            base = f"v_{base}"
        name, n = base, 0
        while name in self.used:
            n += 1
            name = f"{base}_{n}"
        self.used.add(name)
        return name


def c_identifier(name: str) -> str:
    """`name` as a C identifier (for kernel names)."""
    out = re.sub(r"\W", "_", name, flags=re.ASCII) or "kernel"
    return f"k_{out}" if out[0].isdigit() else out


# -- expressions ---------------------------------------------------------------------------


class _KernelWriter:
    """Emits one kernel's body as CUDA C lines."""

    def __init__(self, func: str, launch: Launch, dims: dict[str, bool], params: dict[int, str],
                 narrow: set[int], shared: dict[int, int], size_vars: Sequence[Var]) -> None:
        self.func = func
        self.launch = launch
        self.multi = dims  # tag -> whether the launch may have more than one index on that axis
        self.names = _CNames()
        self.params = params  # buffer id -> C name (parameters and workspaces of this kernel)
        for bid, name in params.items():
            self.names.names[bid] = name
            self.names.used.add(name)
        self.narrow = narrow  # buffer ids indexed in int32
        self.shared = shared  # shared buffer id -> byte offset in the kernel's dynamic shared memory
        self.lines: list[str] = []
        self.depth = 1
        self.ana = Analyzer()
        for v in size_vars:
            self.ana.set_bound(v, IntImm(v.dtype, 0), None)
        self.variant: set[int] = set()  # vars whose value differs between the threads of a block
        self.divergent = 0  # > 0 inside a thread-dependent condition or loop
        self.declared: set[int] = set()  # vars defined so far
        self.uses_half = False
        self.scratch: int | None = None  # where the all-reduces' scratch starts in shared memory
        self.mma = MmaRun()  # tensor-core fragments loaded by the run of products being emitted

    def emit(self, line: str) -> None:
        self.lines.append("  " * self.depth + line)

    def ctype(self, dtype: str) -> str:
        """The C type of `dtype`."""
        return cuda_types.ctype(dtype)

    # -- statements ---------------------------------------------------------------------
    def stmt(self, s: Stmt, unbound: frozenset[str]) -> None:
        """Emits `s`, run by every thread of the launch; `unbound` are the axes no enclosing loop binds."""
        if isinstance(s, SeqStmt) or (isinstance(s, Evaluate) and isinstance(s.value, Call) and s.value.name == MMA):
            self._stmt(s, unbound)
            return
        self.mma.clear()  # fragments loaded before another statement, or in a block it closes, are not reused
        self._stmt(s, unbound)
        self.mma.clear()

    def _stmt(self, s: Stmt, unbound: frozenset[str]) -> None:
        redundant = sorted(t for t in unbound if self.multi.get(t) and t not in bound_tags(s))
        if redundant and not has_sync(s) and not (isinstance(s, SeqStmt) and not s.stmts):
            # a statement outside every loop bound to these axes runs once: on index 0 of each
            self.emit(f"if ({' && '.join(f'{t} == 0' for t in redundant)}) {{")
            self._block(s, unbound - set(redundant), divergent=True)
            self.emit("}")
            return
        if isinstance(s, SeqStmt):
            for c in s.stmts:
                self.stmt(c, unbound)
        elif isinstance(s, BufferStore):
            self.emit(f"{self._access(s.buffer, s.indices[0])} = {cuda_types.bare(self.expr(s.value))};")
        elif isinstance(s, For):
            self._for(s, unbound)
        elif isinstance(s, Allocate):
            self._allocate(s, unbound)
        elif isinstance(s, IfThenElse):
            variant = self._variant(s.cond)
            self.emit(f"if ({cuda_types.bare(self.expr(s.cond))}) {{")
            self._block(s.then_case, unbound, variant)
            if s.else_case is not None:
                self.emit("} else {")
                self._block(s.else_case, unbound, variant)
            self.emit("}")
        elif isinstance(s, LetStmt):
            chain = let_chain(s)  # in a loop: a fused kernel's shared values are a long chain of lets
            with ExitStack() as scope:
                for let in chain:
                    name = self._declare(let.var)
                    value = cuda_types.bare(self.expr(let.value))
                    self.emit(f"const {cuda_types.ctype(let.var.dtype)} {name} = {value};")
                    if self._variant(let.value):
                        self.variant.add(id(let.var))
                    scope.enter_context(self.ana.bound_let(let.var, let.value))
                self.stmt(chain[-1].body, unbound)
        elif isinstance(s, Evaluate):
            self._evaluate(s)
        else:
            raise CodegenError(f"the cuda back end cannot compile statement {type(s).__name__}")

    def _block(self, s: Stmt, unbound: frozenset[str], divergent: bool) -> None:
        self.depth += 1
        self.divergent += divergent
        self.stmt(s, unbound)
        self.divergent -= divergent
        self.depth -= 1

    def _variant(self, e: PrimExpr) -> bool:
        return any(id(v) in self.variant for v in used_vars(e))

    def _evaluate(self, s: Evaluate) -> None:
        v = s.value
        if isinstance(v, Call) and v.name == SYNC_NAME:
            if self.divergent:
                raise CodegenError(f"{self.func}: __syncthreads() under a condition or loop that differs between "
                                   "the threads of a block would hang it; move the barrier out of it")
            self.emit("__syncthreads();")
        elif isinstance(v, Call) and v.name == ALLREDUCE:
            emit_allreduce(self, s)
        elif isinstance(v, Call) and v.name == "prefetch":
            return  # a CPU cache hint; GPUs keep their own (L2) policy
        elif isinstance(v, Call) and v.name == MMA:
            if self.divergent:
                raise CodegenError(f"{self.func}: a warp's mma.sync under a condition or loop that differs between "
                                   "threads would leave lanes out of it; move it out")
            for line in self.mma.statements(v, self.expr, self.names.fresh):
                self.emit(line)
            return
        else:
            self.emit(f"(void)({self.expr(v)});")

    def _declare(self, var: Var) -> str:
        """The C name of `var` at its definition: a fresh one when it was defined before (loop partitioning
        copies loop nests, vars included, and both copies may land in one C scope)."""
        if id(var) in self.declared:
            self.names.names[id(var)] = self.names.fresh(var.name)
        self.declared.add(id(var))
        return self.names(var)

    def _for(self, s: For, unbound: frozenset[str]) -> None:
        var = self._declare(s.loop_var)
        ctype = cuda_types.ctype(s.loop_var.dtype)
        if s.kind is ForKind.THREAD_BINDING:
            tag = s.thread_tag
            lo = "" if isinstance(s.min, IntImm) and s.min.value == 0 else f" + {self.expr(s.min)}"
            self.emit(f"const {ctype} {var} = ({ctype}){tag}{lo};")
            if tag.startswith("threadIdx"):
                self.variant.add(id(s.loop_var))
            needs_guard = self._needs_guard(tag, s.extent)
            with self.ana.bound_range(s.loop_var, s.min, s.extent):
                if needs_guard:
                    self.emit(f"if (({ctype}){tag} < {self.expr(s.extent)}) {{")
                    self._block(s.body, unbound - {tag}, divergent=tag.startswith("threadIdx"))
                    self.emit("}")
                else:
                    self.stmt(s.body, unbound - {tag})
            return
        variant = self._variant(s.min) or self._variant(s.extent)
        if variant:
            self.variant.add(id(s.loop_var))
        if s.kind is ForKind.VECTORIZED and emit_vectorized(self, s):
            return
        if s.kind in (ForKind.UNROLLED, ForKind.VECTORIZED):
            self.emit("#pragma unroll")
        lo = self.expr(s.min)
        zero = isinstance(s.min, IntImm) and s.min.value == 0
        end = self.expr(s.extent) if zero else f"{lo} + {self.expr(s.extent)}"
        self.emit(f"for ({ctype} {var} = {lo}; {var} < {end}; ++{var}) {{")
        with self.ana.bound_range(s.loop_var, s.min, s.extent):
            self._block(s.body, unbound, variant)
        self.emit("}")

    def _needs_guard(self, tag: str, extent: PrimExpr) -> bool:
        if tag.startswith("threadIdx"):
            return isinstance(extent, IntImm) and extent.value < self.launch.block[tag]
        extents = self.launch.grid[tag]
        if len(extents) == 1:
            return False
        static = [int(e.value) for e in extents if isinstance(e, IntImm)]
        if len(static) == len(extents):
            return isinstance(extent, IntImm) and extent.value < max(static)
        return True

    def declare(self, buf: Buffer) -> None:
        """Declares a shared or local temporary at the top of the kernel.

        Declared once per buffer, whatever the number of its `Allocate`s (loop partitioning
        copies a loop body and the allocations in it): a second declaration in one C scope
        would not compile.
        """
        name = self.names(buf)
        ctype = cuda_types.ctype(buf.dtype)
        if _small(buf):
            self.narrow.add(id(buf))
        if buf.scope == "shared":
            self.emit(f"{ctype}* __restrict__ {name} = ({ctype}*)(kiln_shared + {self.shared[id(buf)]});")
        else:
            self.emit(f"{ctype} {name}[{max(_const_size(self.func, buf), 1)}];")

    def _allocate(self, s: Allocate, unbound: frozenset[str]) -> None:
        if s.buffer.scope not in ("shared", "local"):
            buf = s.buffer
            raise CodegenError(
                f"{self.func}: temporary {buf.name} in {buf.scope!r} scope is allocated inside a kernel; "
                "give it 'shared' (one per block) or 'local' (one per thread) scope with set_scope, or compute "
                "it at the root"
            )
        self.stmt(s.body, unbound)

    # -- expressions ----------------------------------------------------------------------
    def _access(self, buf: Buffer, index: PrimExpr) -> str:
        name = self.names.names.get(id(buf))
        if name is None:
            raise CodegenError(f"{self.func}: buffer {buf.name} is used outside its allocation or is not a parameter")
        if id(buf) in self.narrow:
            narrowed = _narrow_index(index)
            index = index if narrowed is None else narrowed
        return f"{name}[{cuda_types.bare(self.expr(index))}]"

    def expr(self, e: PrimExpr) -> str:
        """`e` as a C expression."""
        if isinstance(e, IntImm):
            return _int_literal(int(e.value), e.dtype)
        if isinstance(e, FloatImm):
            self.uses_half |= e.dtype == "float16"
            return _float_literal(e.value, e.dtype)
        if isinstance(e, Var):
            if id(e) not in self.names.names:
                raise CodegenError(f"{self.func}: variable {e.name} is used where it is not bound")
            return self.names.names[id(e)]
        if isinstance(e, BufferLoad):
            return self._access(e.buffer, e.indices[0])
        if isinstance(e, BinaryOp):
            return self._binary(e)
        if isinstance(e, Not):
            return f"(!{self.expr(e.a)})"
        if isinstance(e, Cast):
            return self._cast(self.expr(e.value), e.value.dtype, e.dtype)
        if isinstance(e, Select):
            return f"({self.expr(e.cond)} ? {self.expr(e.true_value)} : {self.expr(e.false_value)})"
        if isinstance(e, Call):
            return self._call(e)
        raise CodegenError(f"the cuda back end cannot compile expression {type(e).__name__}")

    def _binary(self, e: BinaryOp) -> str:
        dt = e.a.dtype
        cuda_types.ctype(dt)
        if dt in NARROW:  # computed in float32, rounded once (see the module docstring)
            self.uses_half |= dt == "float16"
            wide, narrow, _ = NARROW[dt]
            x, y = f"{wide}({self.expr(e.a)})", f"{wide}({self.expr(e.b)})"
            out = self._float_binary(e, x, y, "float32")
            return out if type(e) in (EQ, NE, LT, LE, GT, GE, And, Or) else f"{narrow}({cuda_types.bare(out)})"
        x, y = self.expr(e.a), self.expr(e.b)
        if is_float(dt):
            return self._float_binary(e, x, y, dt)
        t = C_TYPES[dt]
        if type(e) in _C_OPS:
            out = f"({x} {_C_OPS[type(e)]} {y})"
        elif isinstance(e, (Min, Max)):
            out = f"kiln_{'min' if isinstance(e, Min) else 'max'}<{t}>({x}, {y})"
        elif isinstance(e, SHIFTS):
            out = cuda_ops.shift(e, x, y, t)
        elif isinstance(e, (FloorDiv, FloorMod)) and self._positive_const(e.b) and self._non_negative(e.a):
            out = f"({x} {'/' if isinstance(e, FloorDiv) else '%'} {y})"
        elif isinstance(e, Div) and isinstance(e.b, IntImm) and e.b.value not in (0, -1):
            out = f"({x} / {y})"
        elif isinstance(e, (Div, FloorDiv, FloorMod)):
            fn = {Div: "kiln_div", FloorDiv: "kiln_floordiv", FloorMod: "kiln_floormod"}[type(e)]
            out = f"{fn}<{t}>({x}, {y})"
        else:
            raise CodegenError(f"unknown integer operation {type(e).__name__}")
        if dt == "uint16" and isinstance(e, Mul):  # in int, 65535 * 65535 would overflow (undefined in C)
            out = f"((unsigned int){x} * {y})"
        if dt in cuda_types.NARROW_INTS and isinstance(e, (Add, Sub, Mul, Div, FloorDiv, FloorMod)):
            out = f"(({t}){out})"  # C computes in int; the loop IR wraps in the narrow type
        return out

    def _float_binary(self, e: BinaryOp, x: str, y: str, dt: str) -> str:
        if type(e) in _C_OPS:
            return f"({x} {_C_OPS[type(e)]} {y})"
        if isinstance(e, Div):
            return f"({x} / {y})"
        t = C_TYPES[dt]
        if isinstance(e, (Min, Max)):
            return f"kiln_{'min' if isinstance(e, Min) else 'max'}<{t}>({x}, {y})"
        if isinstance(e, FloorDiv):
            return f"{'floorf' if dt == 'float32' else 'floor'}({x} / {y})"
        if isinstance(e, FloorMod):
            return f"kiln_floormod({x}, {y})"
        raise CodegenError(f"unknown float operation {type(e).__name__}")

    def _positive_const(self, e: PrimExpr) -> bool:
        return isinstance(e, IntImm) and e.value > 0

    def _non_negative(self, e: PrimExpr) -> bool:
        if e.dtype not in ("int32", "int64"):
            return e.dtype in cuda_types.UNSIGNED
        lo, _ = self.ana.interval(e)
        return lo is not None and lo >= 0

    def _cast(self, v: str, src: str, dst: str) -> str:
        if src == dst:
            return v
        t = cuda_types.ctype(dst)
        cuda_types.ctype(src)
        if src in NARROW:
            self.uses_half |= src == "float16"
            return self._cast(f"{NARROW[src][0]}({v})", "float32", dst)
        if dst in NARROW:
            self.uses_half |= dst == "float16"
            _, narrow, from_double = NARROW[dst]
            if src == "float64":
                return f"{from_double}({v})"
            return f"{narrow}({v if src == 'float32' else f'(float)({v})'})"
        if dst == "bool":
            return f"({v} != {'0.0f' if src == 'float32' else '0.0' if src == 'float64' else '0'})"
        if is_float(src) and dst in cuda_types.INT_RANGE:
            lo, hi = cuda_types.INT_RANGE[dst]
            return f"kiln_saturate<{t}>({cuda_types.bare(v)}, {lo}, {hi})"
        return f"(({t})({v}))"

    def _call(self, e: Call) -> str:
        if e.name in (SYNC_NAME, "prefetch", ALLREDUCE, MMA):
            raise CodegenError(f"{self.func}: intrinsic {e.name} is a statement (Evaluate), not a value")
        args = e.args
        dt = args[0].dtype if args else e.dtype
        cuda_types.ctype(dt)
        if e.name == "dot4_u8i8":  # x86's vpdpbusd lane (the CPU's int8 products); plain C here
            return f"kiln_dot4_u8i8({self.expr(args[0])}, {self.expr(args[1])})"
        if e.name == "reinterpret":
            if "float16" in (dt, e.dtype):
                self.uses_half = True
            return cuda_types.reinterpret(self.expr(args[0]), dt, e.dtype)
        if not is_float(dt):
            x = self.expr(args[0])
            if e.name == "abs":
                return f"kiln_abs<{C_TYPES[dt]}>({x})" if dt not in cuda_types.UNSIGNED else x
            if e.name == "isnan":
                return "false"
            if e.name in ("floor", "ceil", "round"):
                return x
            raise CodegenError(f"intrinsic {e.name} of integer type {dt}: cast to a float type first")
        half = dt in NARROW
        self.uses_half |= dt == "float16"
        texts = [f"{NARROW[dt][0]}({self.expr(a)})" if half else self.expr(a) for a in args]
        single = dt != "float64"
        if e.name == "isnan":
            return f"isnan({texts[0]})"
        if e.name == "sigmoid":
            one = "1.0f" if single else "1.0"
            out = f"__fdividef({one}, {one} + expf(-({texts[0]})))" if single \
                else f"({one} / ({one} + exp(-({texts[0]}))))"
        elif e.name in _MATH:
            fn = _MATH[e.name][0 if single else 1]
            out = f"{fn}({', '.join(texts)})"
        else:
            raise CodegenError(f"the cuda back end has no intrinsic {e.name!r}")
        return f"{NARROW[dt][1]}({out})" if half else out


def _const_size(func: str, buf: Buffer) -> int:
    (size,) = buf.shape
    if not isinstance(size, IntImm):
        raise CodegenError(f"{func}: {buf.scope} temporary {buf.name} has size {size}; "
                           f"{buf.scope} memory needs a constant size")
    return int(size.value)


# -- the module ------------------------------------------------------------------------------


class CodeGenCUDA:
    """Emits one PrimFunc as CUDA C for one cuda `Target`."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.max_threads = int(target.get("max-threads-per-block", 1024))
        self.max_shared = int(target.get("max-shared-memory-per-block", _STATIC_SHARED_LIMIT))

    def compile(self, func: PrimFunc) -> CudaCode:
        """The CUDA C of `func` and its launch table.

        Raises:
            CodegenError: for loop IR that cannot run as CUDA kernels (an unbound top-level
                loop, a non-constant thread extent, a barrier in divergent code, ...).
        """
        size_vars = tuple(func.size_vars)
        flat = flatten(func)
        workspaces, bodies = split_host(flat)
        if not bodies:
            raise CodegenError(f"{func.name}: nothing to run on the GPU (the function body is empty)")
        param_index = {id(b): i for i, b in enumerate(flat.params)}
        ws_index = {id(b): i for i, b in enumerate(workspaces)}
        narrow = {id(b) for b in (*flat.params, *workspaces) if _small(b)}
        kernels: list[KernelSpec] = []
        texts: list[str] = []
        written: set[int] = set()
        uses_half = any(b.dtype == "float16" for b in (*flat.params, *workspaces))
        for k, body in enumerate(bodies):
            kname = c_identifier(f"{func.name}_kernel{k}")
            spec, text, stored, half = self._kernel(func.name, kname, insert_syncs(body), flat.params, workspaces,
                                                    param_index, ws_index, narrow, size_vars)
            kernels.append(spec)
            texts.append(text)
            written |= {param_index[b] for b in stored if b in param_index}
            uses_half |= half
        header = [f"// CUDA C generated by kiln from PrimFunc {func.name!r}: {len(kernels)} kernel(s)."]
        if uses_half:
            header.append("#include <cuda_fp16.h>")
        header.append(_PRELUDE + cuda_ops.SHIFT_PRELUDE)
        if uses_half:
            header.append(
                "template <> __device__ __forceinline__ __half kiln_min<__half>(__half a, __half b) {\n"
                "  return __float2half(kiln_min<float>(__half2float(a), __half2float(b)));\n}\n"
                "template <> __device__ __forceinline__ __half kiln_max<__half>(__half a, __half b) {\n"
                "  return __float2half(kiln_max<float>(__half2float(a), __half2float(b)));\n}\n"
            )
        if any("kiln_bf16" in text for text in texts):
            header.append(cuda_types.BF16_PRELUDE)
        if any(calls(body, MMA) for body in bodies):
            header.append(MMA_PRELUDE)
        texts = [with_async_waits(t) for t in texts]
        if any("kiln_cp_async16(" in t for t in texts):
            header.append(ASYNC_PRELUDE)
        source = "\n".join(header + texts)
        return CudaCode(func.name, source, tuple(kernels), tuple(workspaces), size_vars, frozenset(written), uses_half)

    def _kernel(
        self, func: str, kname: str, body: Stmt, params: Sequence[Buffer], workspaces: Sequence[Buffer],
        param_index: dict[int, int], ws_index: dict[int, int], narrow: set[int], size_vars: Sequence[Var],
    ) -> tuple[KernelSpec, str, set[int], bool]:
        launch = scan_launch(func, body)
        block, grid = launch.shape(func, self.max_threads)
        threads = block[0] * block[1] * block[2]
        multi = {f"threadIdx.{a}": n > 1 for a, n in zip("xyz", block, strict=True)}
        for a, extents in zip("xyz", grid, strict=True):
            multi[f"blockIdx.{a}"] = any(not (isinstance(e, IntImm) and e.value <= 1) for e in extents)

        # what the kernel touches: buffers (in parameter order, then workspaces), sizes, shared memory
        touched: set[int] = set()
        stored: set[int] = set()
        temps: dict[int, Buffer] = {}  # shared and local temporaries, by id

        def visit(n: Node) -> None:
            if isinstance(n, BufferLoad):
                touched.add(id(n.buffer))
            elif isinstance(n, BufferStore):
                touched.add(id(n.buffer))
                stored.add(id(n.buffer))
            elif isinstance(n, Allocate) and n.buffer.scope in ("shared", "local"):
                temps[id(n.buffer)] = n.buffer

        post_order_visit(body, visit)
        ordered = list(reversed(temps.values()))  # outermost first
        shared: dict[int, int] = {}
        offset = 0
        for buf in ordered:
            if buf.scope == "shared":
                shared[id(buf)] = offset
                offset += -(-_const_size(func, buf) * DataType.of(buf.dtype).bytes // 16) * 16
        scratch, need = None, scratch_bytes(body, launch)  # the all-reduces' slots, after the shared buffers
        if need:
            scratch, offset = offset, offset + -(-need // 16) * 16
        if offset > self.max_shared:
            raise CodegenError(f"{func}: kernel {kname} needs {offset} bytes of shared memory, more than the "
                               f"target's max-shared-memory-per-block {self.max_shared}")
        used = used_vars(body)
        args: list[KernelArg] = []
        names: dict[int, str] = {}
        decls: list[str] = []
        cn = _CNames()
        for kind, bufs, index in (("param", params, param_index), ("workspace", workspaces, ws_index)):
            for b in bufs:
                if id(b) not in touched:
                    continue
                args.append(KernelArg(kind, index[id(b)]))
                names[id(b)] = cn(b)
                const = "" if id(b) in stored else "const "
                decls.append(f"{const}{cuda_types.ctype(b.dtype)}* __restrict__ {names[id(b)]}")
        kernel_sizes = [v for v in size_vars if v in used]
        writer = _KernelWriter(func, launch, multi, names, narrow, shared, size_vars)
        for v in kernel_sizes:
            args.append(KernelArg("size", size_vars.index(v)))
            name = writer.names(v)
            if v.dtype == "int64":
                decls.append(f"long long {name}")
            else:  # sizes arrive as int64, like the llvm back end's
                arg = writer.names.fresh(f"{name}_arg")
                decls.append(f"long long {arg}")
                writer.emit(f"const {cuda_types.ctype(v.dtype)} {name} = ({cuda_types.ctype(v.dtype)}){arg};")
        writer.scratch = scratch
        if shared or scratch is not None:
            writer.emit("extern __shared__ __align__(16) unsigned char kiln_shared[];")
        for buf in ordered:
            writer.declare(buf)
        writer.stmt(body, frozenset(t for t, m in multi.items() if m))
        head = f'extern "C" __global__ void __launch_bounds__({threads}) {kname}({", ".join(decls)}) {{'
        text = "\n".join([head, *writer.lines, "}", ""])
        spec = KernelSpec(kname, grid, block, offset, tuple(args))
        half = writer.uses_half or any(b.dtype == "float16" for b in (*params, *workspaces) if id(b) in touched)
        return spec, text, stored, half


def _small(buf: Buffer) -> bool:
    """Whether `buf` (flattened) has a constant size below 2**31 elements: its offsets fit in int32."""
    (size,) = buf.shape
    return isinstance(size, IntImm) and size.value <= INT32_MAX


def generate(func: PrimFunc, target: Target) -> CudaCode:
    """The CUDA C source of `func` and how to launch its kernels, for cuda target `target`.

    Raises:
        CodegenError: for loop IR that cannot run as CUDA kernels.
    """
    if target.kind.get_attr(TDeviceType) != "cuda":
        raise CodegenError(f"the cuda back end compiles for cuda targets, got {target}")
    return CodeGenCUDA(target).compile(func)
