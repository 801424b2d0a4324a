"""`kiln.mma_m16n8k16` (`kiln.tir.mma`) as CUDA C: fragment loads and one `mma.sync` per call.

Each lane loads its fragments as PTX lays out mma.m16n8k16's operands (with
`g = lane / 4`, `t = lane % 4`): of A rows g and g + 8 at k pairs 2t and 2t + 8,
of B column g at the same k pairs; its four accumulators (rows g, g + 8;
columns 2t, 2t + 1) go through one `mma.sync.aligned.m16n8k16.row.col` with
float32 accumulation. An operand whose k pairs are adjacent and even (the
call's `pa`, `pb`) is fetched with one 32-bit load per pair.

The test stand-in (`tests/cuda_standin.py`) compiles kiln's CUDA C for the host
with `KILN_HOST_EMULATION` defined and supplies its own `kiln_mma_sync_16816`,
which exchanges the lanes' fragments and multiplies them as the hardware
does; everything else here is then run as written. Needs sm_80 or newer
(NVRTC refuses the instruction for older archs).
"""

from __future__ import annotations

from collections.abc import Callable

from kiln.tir.expr import Call, IntImm, PrimExpr
from kiln.tir.functor import post_order_visit
from kiln.tir.stmt import Stmt

MMA_PRELUDE = r"""#ifndef KILN_HOST_EMULATION
__device__ __forceinline__ void kiln_mma_sync_16816(float* d, const unsigned* a, const unsigned* b) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
               "{%8, %9}, {%0, %1, %2, %3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#endif
__device__ __forceinline__ unsigned kiln_pack_half2(__half lo, __half hi) {
  return (unsigned)__half_as_ushort(lo) | ((unsigned)__half_as_ushort(hi) << 16);
}
template <int CH, int CJ, int SR, int SK, int SKB, int SC, int PAIRS_A, int PAIRS_B>
__device__ __forceinline__ void kiln_mma_m16n8k16(float* c, const __half* a, const __half* b) {
  const int lane = (int)(threadIdx.x & 31u), g = lane >> 2, t = lane & 3;
  unsigned ra[4], rb[2];
#pragma unroll
  for (int q = 0; q < 4; ++q) {  // (a0, a1): row g, k 2t; (a2, a3): row g + 8; (a4, a5): k 2t + 8; (a6, a7): both
    const __half* p = a + (g + 8 * (q & 1)) * SR + (2 * t + 8 * (q >> 1)) * SK;
    ra[q] = PAIRS_A ? *(const unsigned*)p : kiln_pack_half2(p[0], p[SK]);
  }
#pragma unroll
  for (int q = 0; q < 2; ++q) {  // (b0, b1): k 2t, 2t + 1 of column g; (b2, b3): k 2t + 8, 2t + 9
    const __half* p = b + (2 * t + 8 * q) * SKB + g * SC;
    rb[q] = PAIRS_B ? *(const unsigned*)p : kiln_pack_half2(p[0], p[SKB]);
  }
  float d[4] = {c[0], c[CJ], c[CH], c[CH + CJ]};
  kiln_mma_sync_16816(d, ra, rb);
  c[0] = d[0];
  c[CJ] = d[1];
  c[CH] = d[2];
  c[CH + CJ] = d[3];
}
"""


def mma_statement(call: Call, expr: Callable[[PrimExpr], str]) -> str:
    """The C statement of one `kiln.mma_m16n8k16` call; `expr` renders its operands' loads."""
    c, ch, cj, a, sr, sk, b, skb, sc, pairs_a, pairs_b = call.args
    consts = [int(x.value) for x in (ch, cj, sr, sk, skb, sc, pairs_a, pairs_b) if isinstance(x, IntImm)]
    assert len(consts) == 8, "kiln.tir.mma builds the call with constant strides"
    return f"kiln_mma_m16n8k16<{', '.join(map(str, consts))}>(&{expr(c)}, &{expr(a)}, &{expr(b)});"


def calls(body: Stmt, name: str) -> bool:
    """Whether `body` calls intrinsic `name`."""
    found: list[bool] = []
    post_order_visit(body, lambda n: found.append(True) if isinstance(n, Call) and n.name == name else None)
    return bool(found)
