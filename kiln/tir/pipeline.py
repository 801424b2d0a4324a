"""The loop-IR steps between lowering and code generation, for every target, in order."""

from __future__ import annotations

from collections.abc import Callable

from kiln.tir.bounds_check import check_accesses
from kiln.tir.mma import tensorize_mma
from kiln.tir.share import bind_shared_func
from kiln.tir.stmt import PrimFunc
from kiln.tir.transform import loop_partition, simplify_func, unroll_loops


def _checked(func: PrimFunc) -> PrimFunc:
    check_accesses(func)
    return func


TIR_PIPELINE: tuple[tuple[str, Callable[[PrimFunc], PrimFunc]], ...] = (
    ("bind_shared", bind_shared_func),  # a value used twice is a let, computed once (te.lower does it too)
    ("simplify", simplify_func),  # fold index arithmetic with loop bounds: (jo*32 + j) // 32 -> jo
    ("loop_partition", loop_partition),  # take tail guards out of the main loops
    ("check_bounds", _checked),  # refuse accesses the loops provably take out of their buffers
    # nests a cuda schedule marks `kiln.mma`: one tensor-core product each; before unrolling, so that a
    # warp's 4 x 8 tiles of a step are one nest to check, not 128: the same kernel, and most of what made a
    # 4096^3 float16 product take 5.5 s to build (1.2 s now)
    ("tensorize_mma", tensorize_mma),
    ("unroll", unroll_loops),  # small unrolled loops become straight-line code
    ("simplify_again", simplify_func),
)


def optimize_tir(func: PrimFunc) -> PrimFunc:
    """Runs `TIR_PIPELINE` over `func`."""
    for _, step in TIR_PIPELINE:
        func = step(func)
    return func
