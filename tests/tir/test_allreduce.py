"""`kiln.warp_allreduce`: building one, reading it back, and the loop-IR passes leaving it whole."""

from __future__ import annotations

import pytest

from kiln import tir
from kiln.tir.allreduce import ALLREDUCE, allreduce, as_allreduce
from kiln.tir.pipeline import optimize_tir
from kiln.tir.share import bind_shared

ACC = tir.buffer("acc", (1,), scope="local")


def test_allreduce_reads_back_as_its_parts() -> None:
    s = allreduce(ACC.load(0), lambda a, b: a + b, 64)
    assert isinstance(s, tir.Evaluate) and isinstance(s.value, tir.Call) and s.value.name == ALLREDUCE
    parts = as_allreduce(s)
    assert parts is not None and parts.threads == 64 and parts.acc.buffer is ACC
    assert str(parts.combined) == f"{parts.a.name} + {parts.b.name}" and parts.a.dtype == "float32"
    assert as_allreduce(tir.Evaluate(tir.call("exp", tir.const(1.0)))) is None
    assert "kiln.warp_allreduce<int32>(acc[0], red_a + red_b, red_a, red_b, 64)" in str(s.value)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: allreduce(tir.buffer("g", (1,)).load(0), tir.max_, 32), "element of a 'local' buffer"),
        (lambda: allreduce(ACC.load(0), tir.max_, 0), "threads must be a positive int"),
        (lambda: allreduce(ACC.load(0), lambda a, b: tir.cast("int32", a), 32), "the combiner gives int32"),
    ],
)
def test_allreduce_refuses_what_no_back_end_can_run(build: object, message: str) -> None:
    with pytest.raises(tir.TIRError, match=message):
        build()  # type: ignore[operator]


def test_tir_call_does_not_know_the_intrinsic() -> None:
    with pytest.raises(tir.TIRError, match="unknown intrinsic 'kiln.warp_allreduce'"):
        tir.call(ALLREDUCE, ACC.load(0))


def test_shared_values_of_the_combiner_stay_inside_the_call() -> None:
    """A combiner that uses a sub-expression twice would otherwise be let-bound outside the call, away
    from the variables it is written over."""
    def square_of_sum(a: tir.PrimExpr, b: tir.PrimExpr) -> tir.PrimExpr:
        total = a + b  # one node, read twice
        return total * total

    s = allreduce(ACC.load(0), square_of_sum, 32)
    shared = tir.call("exp", ACC.load(0))
    assert isinstance(bind_shared(tir.Evaluate(tir.call("exp", shared * shared))), tir.LetStmt)  # elsewhere: a let
    assert bind_shared(s) is s
    body = tir.Allocate(ACC, tir.seq(tir.BufferStore(ACC, tir.const(1.0), (0,)), s))
    func = optimize_tir(tir.PrimFunc("f", [], body))
    found: list[tir.Stmt] = []
    tir.post_order_visit(func.body, lambda n: found.append(n) if isinstance(n, tir.Evaluate) else None)
    (red,) = [as_allreduce(n) for n in found if isinstance(n, tir.Stmt)]
    assert red is not None and red.threads == 32 and str(red.combined) == "(red_a + red_b) * (red_a + red_b)"
