"""Flattening buffer accesses to row-major offsets (kiln/tir/flatten.py)."""

from __future__ import annotations

from kiln import tir
from kiln.tir.flatten import flat_offset
from kiln.tir.simplify import simplify


def test_a_static_buffer_under_2_31_elements_is_indexed_in_int32_widened_once() -> None:
    x = tir.Var("x")  # a fused, split axis over rows of 55: the indices are x // 55 and x % 55
    buf = tir.buffer("B", (128, 55, 55))
    c = tir.Var("c")
    off = flat_offset(buf, (c, x // 55, x % 55))
    assert off.dtype == "int64" and isinstance(off, tir.Cast)
    assert str(simplify(off)) == "int64(c * 3025 + x)"  # contiguous in x: a vector load, not a gather


def test_large_or_symbolic_buffers_are_indexed_in_int64_throughout() -> None:
    i, j = tir.Var("i"), tir.Var("j")
    big = flat_offset(tir.buffer("B", (1 << 16, 1 << 16)), (i, j))
    n = tir.Var("n")
    sym = flat_offset(tir.buffer("S", (n, 8)), (i, j))
    for off in (big, sym):
        assert off.dtype == "int64" and not isinstance(off, tir.Cast)  # each index widened before the products
    assert str(big) == "int64(i) * int64(65536) + int64(j)"
