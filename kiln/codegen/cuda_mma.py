"""`kiln.mma_m16n8k16` (`kiln.tir.mma`) as CUDA C: fragment loads and one `mma.sync` per call.

Each lane loads its fragments as PTX lays out mma.m16n8k16's operands (with
`g = lane / 4`, `t = lane % 4`): of A rows g and g + 8 at k pairs 2t and 2t + 8,
of B column g at the same k pairs; its four accumulators (rows g, g + 8;
columns 2t, 2t + 1) go through one `mma.sync.aligned.m16n8k16.row.col` with
float32 accumulation, on float16 or bfloat16 operands. How an operand is loaded is the call's mode for it:
0 half by half, 1 in 32-bit pairs (k contiguous, even offsets), 2 one
`ldmatrix` (shared memory, the rows of the 8 x 8 blocks 16-byte aligned and k
contiguous), 3 one `ldmatrix.trans` (the same with the other axis contiguous).

A run of calls with nothing between them (a warp's 4 x 8 tiles of one step
of k, unrolled) loads each distinct fragment once: `MmaRun` keeps the ones
loaded so far, and the kernel writer drops them at any other statement.

The test stand-in (`tests/cuda_standin.py`) compiles kiln's CUDA C for the host
with `KILN_HOST_EMULATION` defined and supplies its own `kiln_mma_sync_16816`,
which exchanges the lanes' fragments and multiplies them as the hardware
does; there `ldmatrix` modes load half by half, and everything else runs as
written. Needs sm_80 or newer (NVRTC refuses the instructions for older archs).
"""

from __future__ import annotations

from collections.abc import Callable

from kiln.tir.expr import Call, IntImm, PrimExpr
from kiln.tir.functor import post_order_visit
from kiln.tir.stmt import Stmt

MMA_PRELUDE = r"""#ifndef KILN_HOST_EMULATION
template <bool BF16>
__device__ __forceinline__ void kiln_mma_sync_16816(float* d, const unsigned* a, const unsigned* b) {
  if (BF16)
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <int N, bool TRANS, typename T> __device__ __forceinline__ void kiln_ldmatrix(unsigned* r, const T* p) {
  const unsigned at = (unsigned)__cvta_generic_to_shared(p);
  if (N == 4 && !TRANS)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(at));
  else if (N == 4)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(at));
  else if (!TRANS)
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(at));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(at));
}
#define KILN_LDMATRIX 1
#else
#define KILN_LDMATRIX 0
template <int N, bool TRANS, typename T> void kiln_ldmatrix(unsigned*, const T*) {}
#endif
// Two 16-bit elements (__half or kiln_bf16: a struct of their bits) as one register, the first in the low half.
template <typename T> __device__ __forceinline__ unsigned kiln_pack_half2(const T* lo, const T* hi) {
  return (unsigned)*(const unsigned short*)lo | ((unsigned)*(const unsigned short*)hi << 16);
}
// A's fragment: (a0, a1) row g, k 2t; (a2, a3) row g + 8; (a4, a5) k 2t + 8; (a6, a7) both. ldmatrix: lane i
// gives the address of row i % 8 of 8 x 8 block i / 8 (blocks: rows +8 for odd ones, k +8 for the last two).
template <int SR, int SK, int MODE, typename T>
__device__ __forceinline__ void kiln_mma_load_a(unsigned* r, const T* a) {
  const int lane = (int)(threadIdx.x & 31u), g = lane >> 2, t = lane & 3;
  if (MODE >= 2 && KILN_LDMATRIX) {
    const int q = lane >> 3, i = lane & 7;
    const int row = MODE == 2 ? i + 8 * (q & 1) : 8 * (q & 1), k = MODE == 2 ? 8 * (q >> 1) : i + 8 * (q >> 1);
    kiln_ldmatrix<4, MODE == 3>(r, a + row * SR + k * SK);
    return;
  }
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const T* p = a + (g + 8 * (q & 1)) * SR + (2 * t + 8 * (q >> 1)) * SK;
    r[q] = MODE == 1 ? *(const unsigned*)p : kiln_pack_half2(p, p + SK);
  }
}
// B's fragment: (b0, b1) k 2t, 2t + 1 of column g; (b2, b3) k 2t + 8, 2t + 9. ldmatrix: lanes 0-15 give the
// addresses of the rows of two 8 x 8 blocks (k +8 for the second).
template <int SKB, int SC, int MODE, typename T>
__device__ __forceinline__ void kiln_mma_load_b(unsigned* r, const T* b) {
  const int lane = (int)(threadIdx.x & 31u), g = lane >> 2, t = lane & 3;
  if (MODE >= 2 && KILN_LDMATRIX) {
    const int q = (lane >> 3) & 1, i = lane & 7;
    const int col = MODE == 2 ? i : 0, k = MODE == 2 ? 8 * q : i + 8 * q;
    kiln_ldmatrix<2, MODE == 3>(r, b + k * SKB + col * SC);
    return;
  }
#pragma unroll
  for (int q = 0; q < 2; ++q) {
    const T* p = b + (2 * t + 8 * q) * SKB + g * SC;
    r[q] = MODE == 1 ? *(const unsigned*)p : kiln_pack_half2(p, p + SKB);
  }
}
// The lane's accumulators: c[0] row g, column 2t; c[CJ] column 2t + 1; c[CH] row g + 8; c[CH + CJ] both.
template <int CH, int CJ, bool BF16>
__device__ __forceinline__ void kiln_mma_tile(float* c, const unsigned* a, const unsigned* b) {
  float d[4] = {c[0], c[CJ], c[CH], c[CH + CJ]};
  kiln_mma_sync_16816<BF16>(d, a, b);
  c[0] = d[0];
  c[CJ] = d[1];
  c[CH] = d[2];
  c[CH + CJ] = d[3];
}
"""


class MmaRun:
    """The fragments loaded in the current run of `kiln.mma_m16n8k16` calls (see the module docstring)."""

    def __init__(self) -> None:
        self.loaded: dict[str, str] = {}  # the load's C text -> the array holding its fragment

    def clear(self) -> None:
        """Forgets the fragments: another statement came between the calls."""
        self.loaded.clear()

    def statements(self, call: Call, expr: Callable[[PrimExpr], str], fresh: Callable[[str], str]) -> list[str]:
        """The C statements of one call: loads of the fragments not loaded yet in this run, then the product.

        `expr` renders the operands' loads, `fresh` gives an unused C name.
        """
        c, ch, cj, a, sr, sk, b, skb, sc, mode_a, mode_b = call.args
        consts = [int(x.value) for x in (ch, cj, sr, sk, skb, sc, mode_a, mode_b) if isinstance(x, IntImm)]
        assert len(consts) == 8, "kiln.tir.mma builds the call with constant strides and modes"
        ch_, cj_, sr_, sk_, skb_, sc_, ma, mb = consts
        out: list[str] = []
        names = []
        for kind, words, load in (("a", 4, f"kiln_mma_load_a<{sr_}, {sk_}, {ma}>(%s, &{expr(a)});"),
                                  ("b", 2, f"kiln_mma_load_b<{skb_}, {sc_}, {mb}>(%s, &{expr(b)});")):
            name = self.loaded.get(load)
            if name is None:
                name = self.loaded[load] = fresh(f"kiln_frag_{kind}")
                out += [f"unsigned {name}[{words}];", load % name]
            names.append(name)
        bf16 = "true" if a.dtype == "bfloat16" else "false"
        out.append(f"kiln_mma_tile<{ch_}, {cj_}, {bf16}>(&{expr(c)}, {names[0]}, {names[1]});")
        return out


def calls(body: Stmt, name: str) -> bool:
    """Whether `body` calls intrinsic `name`."""
    found: list[bool] = []
    post_order_visit(body, lambda n: found.append(True) if isinstance(n, Call) and n.name == name else None)
    return bool(found)
