"""`kiln.warp_allreduce` (`kiln.tir.allreduce`) as CUDA C: warp shuffles, and shared memory across warps.

Every thread of threadIdx.x enters with its partial result and leaves with the
combination of all of them (an all-reduce), so the statements after it read the
row's value from a register, with no broadcast and no barrier:

- up to 32 threads (a power of two: the row's threads are aligned lanes of one
  warp): a butterfly, `log2(threads)` steps of `__shfl_xor_sync` in which each
  lane combines its value with the one of the lane whose index differs in one
  bit. Threads of other rows (threadIdx.y) share the warp and exchange in
  their own group of lanes, since no step's lane mask reaches past the group.
- more (a multiple of 32 whose number of warps is a power of two): the butterfly
  within each warp; lane 0 of each warp puts its warp's result in a scratch
  array in shared memory; after a barrier every warp reads its row's partial
  results, one per lane, and combines them with a second butterfly. A barrier
  before the scratch is written keeps a previous all-reduce's readers from
  seeing it change. The scratch (`scratch_bytes`) is placed after the kernel's
  shared buffers, one slot per warp of the block.

The threads taking part must be the block's whole threadIdx.x extent, and the
statement must be reached by all threads of the block: a shuffle or barrier
that some threads skip is undefined (a hang, on a barrier), so one under a
condition or loop that differs between threads is refused, as a barrier is.
Values narrower than 32 bits are shuffled as int (float16 as float); the
combiner runs in the accumulator's own type, as the loop IR defines it.
"""

from __future__ import annotations

from typing import Protocol

from kiln.codegen.cuda_host import Launch
from kiln.codegen.jit import CodegenError
from kiln.tir.allreduce import AllReduce, as_allreduce
from kiln.tir.expr import PrimExpr, Var
from kiln.tir.functor import Node, post_order_visit
from kiln.tir.stmt import Evaluate, Stmt

WARP = 32
_SLOT_BYTES = 8  # one scratch slot per warp holds any shuffled type (double, long long)
# dtype -> (C type it is shuffled as, to that type, back); others are shuffled as themselves
_SHUFFLED: dict[str, tuple[str, str, str]] = {
    "float16": ("float", "__half2float({})", "__float2half({})"),
    "bfloat16": ("float", "kiln_bf16_to_float({})", "kiln_float_to_bf16({})"),
    "bool": ("int", "(int)({})", "({} != 0)"),
    "int8": ("int", "(int)({})", "(signed char)({})"),
    "int16": ("int", "(int)({})", "(short)({})"),
    "uint8": ("int", "(int)({})", "(unsigned char)({})"),
    "uint16": ("int", "(int)({})", "(unsigned short)({})"),
}


class Writer(Protocol):
    """What the all-reduce needs of `kiln.codegen.cuda`'s kernel writer."""

    func: str
    launch: Launch
    divergent: int
    scratch: int | None  # byte offset of the all-reduce scratch in the kernel's dynamic shared memory

    def emit(self, line: str) -> None: ...
    def expr(self, e: PrimExpr) -> str: ...
    def ctype(self, dtype: str) -> str: ...
    def _declare(self, var: Var) -> str: ...


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _block(launch: Launch) -> tuple[int, int, int]:
    return launch.block.get("threadIdx.x", 1), launch.block.get("threadIdx.y", 1), launch.block.get("threadIdx.z", 1)


def scratch_bytes(body: Stmt, launch: Launch) -> int:
    """The shared memory the all-reduces of kernel `body` need across warps: a slot per warp of the
    block where some all-reduce spans more than one warp, else 0."""
    wide: list[bool] = []

    def visit(n: Node) -> None:
        red = as_allreduce(n) if isinstance(n, Evaluate) else None
        if red is not None and red.threads > WARP:
            wide.append(True)

    post_order_visit(body, visit)
    bx, by, bz = _block(launch)
    return -(-bx * by * bz // WARP) * _SLOT_BYTES if wide else 0


def _linear(launch: Launch) -> str:
    """This thread's index in its block, whose warps are its runs of 32."""
    bx, by, bz = _block(launch)
    if by * bz == 1:
        return "(int)threadIdx.x"
    return f"((int)threadIdx.x + {bx} * ((int)threadIdx.y + {by} * (int)threadIdx.z))"


def _mask(launch: Launch) -> str:
    """The lanes of this thread's warp: all 32, but for the last warp of a block whose size is not a multiple
    of 32 (its missing lanes must not be named)."""
    bx, by, bz = _block(launch)
    total = bx * by * bz
    if total % WARP == 0:
        return "0xffffffffu"
    if total < WARP:
        return f"0x{(1 << total) - 1:x}u"
    return f"(({_linear(launch)} >> 5) == {total // WARP} ? 0x{(1 << total % WARP) - 1:x}u : 0xffffffffu)"


def emit_allreduce(w: Writer, s: Evaluate) -> None:
    """Emits the all-reduce statement `s` (see the module docstring).

    Raises:
        CodegenError: the threads are not the block's threadIdx.x extent (or not a count the butterfly
            covers), or the statement is under a condition or loop that differs between threads.
    """
    red = as_allreduce(s)
    assert red is not None
    bx, _, _ = _block(w.launch)
    what = f"{w.func}: the all-reduce of {red.acc.buffer.name} over {red.threads} threads"
    if red.threads != bx:
        raise CodegenError(f"{what}: it must span the block's threadIdx.x extent, {bx}")
    if not (_is_pow2(red.threads) and (red.threads <= WARP or _is_pow2(red.threads // WARP))):
        raise CodegenError(f"{what}: the thread count must be a power of two")
    if w.divergent:
        raise CodegenError(f"{what} is under a condition or loop that differs between the threads of a block, "
                           "which would leave some of them out of its shuffles and barriers; move it out")
    dtype = red.acc.dtype
    ctype = w.ctype(dtype)
    shuffled, to, back = _SHUFFLED.get(dtype, (ctype, "{}", "{}"))
    acc = w.expr(red.acc)
    a = w._declare(red.a)
    w.emit(f"{{  // all-reduce over {red.threads} threads of threadIdx.x")
    w.emit(f"  {ctype} {a} = {acc};")
    mask = _mask(w.launch)
    _butterfly(w, red, min(red.threads, WARP), mask, ctype, to, back)
    if red.threads > WARP:
        if w.scratch is None:  # scratch_bytes saw no wide all-reduce: a bug of this module
            raise CodegenError(f"{what}: no scratch memory was set aside for it")
        warps = red.threads // WARP
        w.emit(f"  {shuffled}* kiln_scratch = ({shuffled}*)(kiln_shared + {w.scratch});")
        w.emit(f"  const int kiln_warp = {_linear(w.launch)} >> 5;")
        w.emit("  __syncthreads();  // every thread is past the reads of a previous all-reduce's scratch")
        w.emit(f"  if (((int)threadIdx.x & 31) == 0) kiln_scratch[kiln_warp] = {to.format(a)};")
        w.emit("  __syncthreads();")
        row_warp = f"kiln_scratch[(kiln_warp & ~{warps - 1}) + ((int)threadIdx.x & {warps - 1})]"  # one per lane
        w.emit(f"  {a} = {back.format(row_warp)};")
        _butterfly(w, red, warps, mask, ctype, to, back)
    w.emit(f"  {acc} = {a};")
    w.emit("}")


def _butterfly(w: Writer, red: AllReduce, lanes: int, mask: str, ctype: str, to: str, back: str) -> None:
    """`log2(lanes)` shuffle steps: each lane combines with the lane whose index differs in one bit below `lanes`."""
    if lanes < 2:
        return
    a = w.expr(red.a)
    w.emit("  #pragma unroll")
    w.emit(f"  for (int kiln_lane_mask = {lanes // 2}; kiln_lane_mask > 0; kiln_lane_mask >>= 1) {{")
    b = w._declare(red.b)
    w.emit(f"    const {ctype} {b} = {back.format(f'__shfl_xor_sync({mask}, {to.format(a)}, kiln_lane_mask)')};")
    w.emit(f"    {a} = {w.expr(red.combined)};")
    w.emit("  }")


__all__ = ["WARP", "emit_allreduce", "scratch_bytes"]
