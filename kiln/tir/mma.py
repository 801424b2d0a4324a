"""`kiln.mma_m16n8k16`: a warp's tensor-core product, tensorized from the loop nest a schedule marks.

A GPU schedule that tiles a float16 product for tensor cores (`cuda_schedules.
schedule_tensorcore`) gives each thread of a warp the accumulators that the
hardware's `mma.sync.m16n8k16` leaves in it: with `lane` = threadIdx.x (the
block's x extent is exactly one warp), `g = lane // 4` and `t = lane % 4`, the
thread holds rows `g` and `g + 8` and columns `2t` and `2t + 1` of each 16 x 8
tile. Its loop IR is then ordinary per-thread code,

    for h in range(2):            # pragma kiln.mma
      for j in range(2):
        for k in range(16):
          acc[c0 + h*ch + j*cj] += float(A[a0 + (g + 8h)*sr + k*sk]) * float(B[b0 + k*skb + (2t + j)*sc])

and `tensorize_mma` replaces each such nest by one statement,

    Evaluate(Call("int32", "kiln.mma_m16n8k16", (acc[c0], ch, cj, A[a0], sr, sk, B[b0], skb, sc, ma, mb)))

whose meaning, per thread, is exactly that nest. `A[a0]` and `B[b0]` are the
warp's corner (lane 0's addresses), the strides are in elements of the
flattened buffers, and `ma` (`mb`) says how A's (B's) fragments may be
loaded: 2 or 3 by `ldmatrix` (or its `.trans`) where the operand is in shared
memory with 16-byte aligned rows of 8 x 8 blocks, 1 in 32-bit pairs where k is
contiguous at even offsets, else 0, half by half. The CUDA back end renders it
as one `mma.sync` after each thread loads its fragments (its own rows of A,
and column `g` of B: the hardware's layout, not the one the nest reads per
thread); so all 32 lanes must run it together,
which the nest's place guarantees (no guard between it and the warp's
threadIdx.x loop, whose extent is checked to be 32).

The pass checks that a marked nest is this computation (loop extents, the
operand dtypes, and the indices against the strides it derives: every lane at
the first iteration, every iteration at lanes 0 and 31)
and raises `TIRError` naming the loop otherwise: a schedule that marks the
wrong loops gets an error, never a wrong product. The initial zeroing that te
emits with the same loops (same pragma) is left as loops.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from kiln.ir.dtype import NARROW_FLOATS
from kiln.tir.expr import Add, Buffer, BufferLoad, Call, Cast, IntImm, Mul, PrimExpr, TIRError, Var
from kiln.tir.functor import StmtExprMutator, buffer_loads
from kiln.tir.simplify import Analyzer
from kiln.tir.stmt import BufferStore, Evaluate, For, ForKind, LetStmt, PrimFunc, Stmt
from kiln.tir.transform import substitute

MMA = "kiln.mma_m16n8k16"
PRAGMA = "kiln.mma"  # the pragma a schedule puts on the nest's outermost loop
WARP = 32
_Access = tuple[Buffer, tuple[PrimExpr, ...]]


def _flat(buf: Buffer, indices: tuple[PrimExpr, ...]) -> PrimExpr:
    """The row-major element offset of `buf[indices]` (its shape is constant)."""
    offset: PrimExpr = IntImm("int32", 0)
    for index, extent in zip(indices, buf.shape, strict=True):
        if not isinstance(extent, IntImm):
            raise TIRError(f"{MMA}: buffer {buf.name} has a symbolic shape {buf.shape}")
        offset = offset * int(extent.value) + index
    return offset


def _operand(e: PrimExpr) -> BufferLoad | None:
    """The float16 or bfloat16 load that `e` (a float32 operand of the product) converts, or None."""
    if isinstance(e, Cast) and e.dtype == "float32":
        e = e.value
    return e if isinstance(e, BufferLoad) and e.dtype in NARROW_FLOATS else None


class _Tensorizer(StmtExprMutator):
    def __init__(self, func: str) -> None:
        super().__init__()
        self.func = func
        self.lane: Var | None = None
        self.ana = Analyzer()

    def visit_for(self, s: For) -> Stmt:
        if s.kind is ForKind.THREAD_BINDING and s.thread_tag == "threadIdx.x":
            outer, self.lane = self.lane, (s.loop_var if _is_int(s.extent, WARP) and _is_int(s.min, 0) else None)
            try:
                return super().visit_for(s)
            finally:
                self.lane = outer
        if PRAGMA not in s.annotations:
            return super().visit_for(s)
        return self._tensorize(s)

    def _fail(self, s: For, why: str) -> TIRError:
        return TIRError(f"{self.func}: the loop {s.loop_var.name} marked {PRAGMA!r} is not a warp's "
                        f"m16n8k16 product: {why}")

    def _tensorize(self, s: For) -> Stmt:
        loops: list[For] = []
        lets: dict[Var, PrimExpr] = {}
        body: Stmt = s
        while isinstance(body, For | LetStmt):
            if isinstance(body, For):
                loops.append(body)
            else:
                lets[body.var] = substitute(body.value, lets)
            body = body.body
        if not isinstance(body, BufferStore):
            raise self._fail(s, "it must be loops around one store")
        acc = body.buffer
        value = substitute(body.value, lets)
        if not any(ld.buffer is acc for ld in buffer_loads(value)):  # te's zeroing of the accumulators: loops stay
            annotations = {key: v for key, v in s.annotations.items() if key != PRAGMA}
            return For(s.loop_var, s.min, s.extent, s.kind, s.body, s.thread_tag, annotations)
        if self.lane is None:
            raise self._fail(s, "it is not inside a threadIdx.x loop of extent 32 (one warp)")
        if len(loops) != 3 or not all(_is_int(lp.min, 0) for lp in loops) or sorted(map(_ext, loops)) != [2, 2, 16]:
            raise self._fail(s, "it must be three loops of extents 2, 2 and 16 around one accumulation")
        if acc.scope != "local" or acc.dtype != "float32" or not isinstance(value, Add):
            raise self._fail(s, "it must accumulate into a float32 'local' buffer")
        prev, prod = (value.a, value.b) if isinstance(value.a, BufferLoad) else (value.b, value.a)
        if not (isinstance(prev, BufferLoad) and prev.buffer is acc and isinstance(prod, Mul)):
            raise self._fail(s, "its value must be acc + a * b")
        x, y = _operand(prod.a), _operand(prod.b)
        if x is None or y is None or x.dtype != y.dtype:
            raise self._fail(s, "its operands must be float16 loads, or bfloat16 loads (converted to float32)")
        k = next(lp for lp in loops if _ext(lp) == 16).loop_var
        h, j = (lp.loop_var for lp in loops if lp.loop_var is not k)
        store = (acc, tuple(substitute(i, lets) for i in body.indices))
        for a, b, rows, cols in ((x, y, h, j), (x, y, j, h), (y, x, h, j), (y, x, j, h)):
            args = self._match(self.lane, lets, store, (a.buffer, a.indices), (b.buffer, b.indices), rows, cols, k)
            if args is not None:
                return Evaluate(Call("int32", MMA, args))
        raise self._fail(s, "its indices are not those of the fragments (lane g + 8h rows of one operand, "
                            "2t + j columns of the other, k contiguous in neither or both)")

    def _match(self, lane: Var, lets: dict[Var, PrimExpr], c: _Access, a: _Access, b: _Access,
               rows: Var, cols: Var, k: Var) -> tuple[PrimExpr | int, ...] | None:
        """The intrinsic's arguments where A = `a`, B = `b` and the loops have those roles; else None."""
        corner: dict[Var, PrimExpr] = {lane: _int(0), rows: _int(0), cols: _int(0), k: _int(0)}

        def offsets(acc: _Access) -> tuple[BufferLoad, Callable[..., int | None]]:
            buf, idx = acc
            idx = tuple(substitute(i, lets) for i in idx)
            flat = _flat(buf, idx)
            origin = self.ana.simplify(substitute(flat, corner))

            def diff(ln: int = 0, hh: int = 0, jj: int = 0, kk: int = 0) -> int | None:
                at = {lane: _int(ln), rows: _int(hh), cols: _int(jj), k: _int(kk)}
                d = self.ana.simplify(substitute(flat, at) - origin)
                return int(d.value) if isinstance(d, IntImm) else None
            return BufferLoad(buf.dtype, buf, tuple(self.ana.simplify(substitute(i, corner)) for i in idx)), diff

        (ca, da), (cb, db), (cc, dc) = offsets(a), offsets(b), offsets(c)
        sr8, sk, skb, sc, ch, cj = da(hh=1), da(kk=1), db(kk=1), db(jj=1), dc(hh=1), dc(jj=1)
        if sr8 is None or sk is None or skb is None or sc is None or ch is None or cj is None or sr8 % 8:
            return None
        sr = sr8 // 8
        # Every lane at the nest's first iteration (the lane enters through // and %), every iteration of
        # lanes 0 and 31 at the ends and middle of k (the loops enter affinely: te's indices are affine in them)
        points = [(ln, 0, 0, 0) for ln in range(WARP)]
        points += [(ln, hh, jj, kk) for ln in (0, 31) for hh in (0, 1) for jj in (0, 1) for kk in (0, 1, 8, 15)]
        for ln, hh, jj, kk in points:
            g, t = divmod(ln, 4)
            if (da(ln, hh, jj, kk) != (g + 8 * hh) * sr + kk * sk
                    or db(ln, hh, jj, kk) != kk * skb + (2 * t + jj) * sc
                    or dc(ln, hh, jj, kk) != hh * ch + jj * cj):
                return None
        mode_a = self._mode(a[0], ca, sk, sr)
        mode_b = self._mode(b[0], cb, skb, sc)
        return cc, ch, cj, ca, sr, sk, cb, skb, sc, mode_a, mode_b

    def _mode(self, buf: Buffer, corner: BufferLoad, along_k: int, across: int) -> int:
        """How an operand's fragment may be loaded (`kiln.codegen.cuda_mma`): 2 (3) by ldmatrix (.trans)
        where it is in shared memory and 8 x 8 blocks have 16-byte aligned rows of k (of the other axis),
        1 in 32-bit pairs where k is contiguous at even offsets, else 0."""
        offset = self.ana.linear(_flat(buf, corner.indices))
        if buf.scope == "shared" and offset.divisible(8):
            if along_k == 1 and across % 8 == 0:
                return 2
            if across == 1 and along_k % 8 == 0:
                return 3
        return 1 if along_k == 1 and across % 2 == 0 and offset.divisible(2) else 0


def _int(v: int) -> PrimExpr:
    return IntImm("int32", v)


def _is_int(e: PrimExpr, v: int) -> bool:
    return isinstance(e, IntImm) and int(e.value) == v


def _ext(lp: For) -> int:
    return int(lp.extent.value) if isinstance(lp.extent, IntImm) else -1


def tensorize_mma(func: PrimFunc) -> PrimFunc:
    """Replaces each loop nest marked `kiln.mma` by the warp-level intrinsic (see the module docstring)."""
    return attrs.evolve(func, body=_Tensorizer(func.name).visit_stmt(func.body))


__all__ = ["MMA", "PRAGMA", "tensorize_mma"]
