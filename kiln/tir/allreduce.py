"""`kiln.warp_allreduce`: the cross-thread all-reduce that a GPU reduction over threads lowers to.

A te schedule may bind a (split) reduction axis to `threadIdx.x`: each thread
then accumulates its strided part of the row in a register, and the threads
combine their partial results. Loop IR is sequential, so that combining step
cannot be written as loops; it is one statement,

    Evaluate(Call("int32", "kiln.warp_allreduce", (acc[0], combine(a, b), a, b, threads)))

run by every one of the `threads` threads bound to `threadIdx.x` (the whole
`threadIdx.x` extent of the block): each enters with its partial result in
`acc[0]` (a "local" buffer element) and leaves with the combination of all of
them, in the same place. `combine(a, b)` is the reducer's combiner written over
the two variables `a` and `b`, which are bound only inside the call (a lambda
in the IR: sum, max, a select, any of the `te.comm_reducer`s). The CUDA back
end renders it as a butterfly of warp shuffles, with a step through shared
memory across the warps of a block (`kiln.codegen.cuda_allreduce`); the llvm
back end refuses it (its loops are never bound to threads).

Like `syncthreads`, it is not in `tir.INTRINSICS`: `tir.call` refuses the name,
so only `allreduce` builds one.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from kiln.tir.expr import BufferLoad, Call, IntImm, PrimExpr, TIRError, Var
from kiln.tir.stmt import Evaluate, Stmt

ALLREDUCE = "kiln.warp_allreduce"


@attrs.frozen
class AllReduce:
    """The parts of one `kiln.warp_allreduce` statement."""

    acc: BufferLoad  # each thread's partial result, replaced by the combination of all of them
    combined: PrimExpr  # the combiner over `a` and `b`
    a: Var
    b: Var
    threads: int  # how many threads of threadIdx.x take part (the block's whole threadIdx.x extent)


def allreduce(acc: BufferLoad, combine: Callable[[PrimExpr, PrimExpr], PrimExpr], threads: int) -> Evaluate:
    """The all-reduce of `acc` over `threads` threads of threadIdx.x, by `combine`.

    Raises:
        TIRError: `acc` is not an element of a "local" buffer, or `threads` is not positive.
    """
    if not isinstance(acc, BufferLoad) or acc.buffer.scope != "local":
        raise TIRError(f"{ALLREDUCE}: the accumulator must be an element of a 'local' buffer, got {acc!r}")
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise TIRError(f"{ALLREDUCE}: threads must be a positive int, got {threads!r}")
    a, b = Var("red_a", acc.dtype), Var("red_b", acc.dtype)
    combined = combine(a, b)
    if combined.dtype != acc.dtype:
        raise TIRError(f"{ALLREDUCE}: the combiner gives {combined.dtype}, the accumulator is {acc.dtype}")
    return Evaluate(Call("int32", ALLREDUCE, (acc, combined, a, b, IntImm("int32", threads))))


def as_allreduce(s: Stmt) -> AllReduce | None:
    """The all-reduce that `s` is, or None when it is another statement."""
    if not (isinstance(s, Evaluate) and isinstance(s.value, Call) and s.value.name == ALLREDUCE):
        return None
    acc, combined, a, b, threads = s.value.args
    assert isinstance(acc, BufferLoad) and isinstance(a, Var) and isinstance(b, Var) and isinstance(threads, IntImm)
    return AllReduce(acc, combined, a, b, int(threads.value))


__all__ = ["ALLREDUCE", "AllReduce", "allreduce", "as_allreduce"]
