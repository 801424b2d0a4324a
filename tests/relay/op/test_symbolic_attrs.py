"""Attributes that name sizes: a reshape to (n, s, 8), a slice to [0:s] of a static table, a range to s,
a broadcast to (n, s). Each is typed exactly, compiled once and run at several sizes against numpy; what an
op assumes of the sizes (s <= 50 for a slice of 50 rows) is checked before anything runs, and the text
format, the interpreter, `specialize=` and a library file all keep such attributes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kiln import relay, runtime
from kiln.ir.types import SizeVar
from kiln.relay.backend.build_module import BuildError
from kiln.relay.parser import parse
from kiln.relay.printer import astext
from kiln.runtime import ExecutorError

Array = np.ndarray[Any, Any]
n, s = SizeVar("n"), SizeVar("s")


def _rand(*shape: int, seed: int = 0) -> Array:
    return np.random.default_rng(seed + sum(shape)).standard_normal(shape).astype("float32")


def _positions() -> relay.Function:
    """x (n, s, 4) plus the first s rows of a 50-row table, and the flattened rows reshaped back."""
    x = relay.var("x", shape=("n", "s", 4))
    table = relay.const(np.arange(200, dtype="float32").reshape(50, 4))
    rows = relay.strided_slice(table, [0], [s], axes=[0])
    flat = relay.reshape(x, (-1, 4))
    return relay.Function([x], relay.Tuple([relay.add(x, rows), relay.reshape(relay.exp(flat), (n, s, 4))]))


def test_a_slice_to_a_size_and_a_reshape_to_sizes_are_typed_exactly_and_run_every_size() -> None:
    fn = relay.transform.InferType()(relay.IRModule.from_expr(_positions()))["main"]
    assert str(fn.checked_type.ret_type) == "(Tensor[(n, s, 4), float32], Tensor[(n, s, 4), float32])"
    lib = relay.build(fn)
    assert [(str(a), str(b)) for a, b, _ in lib.graph.checks] == [("s", "50")]
    ex = lib.create_executor()
    table = np.arange(200, dtype="float32").reshape(50, 4)
    for batch, seq in [(1, 1), (3, 17), (2, 50)]:
        x = _rand(batch, seq, 4)
        added, exp = ex(x=x)
        np.testing.assert_allclose(added, x + table[:seq], rtol=1e-6)
        np.testing.assert_allclose(exp, np.exp(x), rtol=1e-6)
    with pytest.raises(ExecutorError, match=r"strided_slice .*the slice \[0:s\] of axis 0, of size 50 needs "
                                            r"s <= 50, which the sizes s = 51 break \(n from input x.shape\[0\], "
                                            r"s from input x.shape\[1\]\)"):
        ex(x=_rand(1, 51, 4))


def test_a_slice_of_a_symbolic_axis_from_a_static_start_and_from_the_end() -> None:
    x = relay.var("x", shape=("n", "s"))
    fn = relay.Function([x], relay.Tuple([relay.strided_slice(x, [1], [2**31 - 1], axes=[1]),
                                          relay.strided_slice(x, [-2], [2**31 - 1], axes=[1])]))
    lib = relay.build(fn)
    typed = relay.transform.InferType()(relay.IRModule.from_expr(fn))["main"]
    assert str(typed.checked_type.ret_type) == "(Tensor[(n, s - 1), float32], Tensor[(n, 2), float32])"
    ex = lib.create_executor()
    for seq in (2, 3, 17):
        x_ = _rand(2, seq)
        tail, last = ex(x=x_)
        np.testing.assert_array_equal(tail, x_[:, 1:])
        np.testing.assert_array_equal(last, x_[:, -2:])
    with pytest.raises(ExecutorError, match=r"the slice \[s - 2:s\] of axis 1, of size s needs 0 <= s - 2"):
        ex(x=_rand(2, 1))


def test_a_slice_no_size_can_satisfy_is_refused_at_build() -> None:
    x, y = relay.var("x", shape=(8,)), relay.var("y", shape=("s",))
    with pytest.raises(BuildError, match=r"strided_slice .*the slice \[s:10\] of axis 0, of size 8 needs 10 <= 8, "
                                         "which no size makes true"):
        relay.build(relay.Function([x, y], relay.Tuple([relay.strided_slice(x, [s], [10]), y])))
    z = relay.var("z", shape=("n",))
    with pytest.raises(relay.TypeInferenceError, match=r"the slice \[5:2\] of an axis of size n ends before it starts"):
        relay.build(relay.Function([z], relay.strided_slice(z, [5], [2])))


def test_a_range_to_a_size_and_a_broadcast_to_sizes() -> None:
    x, bias = relay.var("x", shape=("n", "s")), relay.var("bias", shape=("n", 1))
    positions = relay.cast(relay.arange(s, dtype="int64"), "float32")
    fn = relay.Function([x, bias], relay.add(relay.add(x, positions), relay.broadcast_to(bias, (n, s))))
    ex = relay.build(fn).create_executor()
    for batch, seq in [(1, 1), (3, 17), (4, 64)]:
        x_, b_ = _rand(batch, seq), _rand(batch, 1, seed=1)
        np.testing.assert_allclose(ex(x=x_, bias=b_), x_ + np.arange(seq) + b_, rtol=1e-6)
    with pytest.raises(relay.TypeInferenceError, match="a range to the size s needs an integer start and step 1"):
        relay.build(relay.Function([x], relay.add(x, relay.arange(0, s, 2))))


def test_a_broadcast_of_a_size_to_a_static_dim_needs_them_equal() -> None:
    x = relay.var("x", shape=("n", 1))
    ex = relay.build(relay.Function([x], relay.broadcast_to(x, (4, 6)))).create_executor()
    np.testing.assert_array_equal(ex(x=np.ones((4, 1), "float32")), np.ones((4, 6)))
    with pytest.raises(ExecutorError, match=r"broadcasting dim 0 of the data \(n\) to 4 needs n <= 4, which the "
                                            "sizes n = 5 break"):
        ex(x=np.ones((5, 1), "float32"))


def test_sizes_in_attributes_round_trip_through_the_text_format() -> None:
    mod = relay.transform.InferType()(relay.IRModule.from_expr(_positions()))
    text = astext(mod)
    assert 'end=["s"]' in text and 'newshape=["n", "s", 4]' in text
    again = relay.transform.InferType()(parse(text))
    assert astext(again) == text
    with pytest.raises(relay.ParseError, match="newshape"):
        parse(text.replace('newshape=["n", "s", 4]', 'newshape=["n s", "s", 4]'))


def test_the_interpreter_and_specialize_put_the_sizes_into_the_attributes() -> None:
    fn = _positions()
    x = _rand(2, 7, 4)
    want = relay.build(fn).create_executor()(x=x)
    debug = relay.create_executor("debug", relay.IRModule.from_expr(fn)).evaluate()(x=x)
    lib = relay.build(fn, specialize={"s": [7]})
    assert [sorted(sizes) for sizes, _ in lib.variants] == [["s"]]
    for got in (debug, lib.create_executor()(x=x)):
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-6)


def test_a_library_file_keeps_the_size_checks(tmp_path: Any) -> None:
    lib = relay.build(_positions())
    lib.export(tmp_path / "m.kiln")
    loaded = runtime.load(tmp_path / "m.kiln")
    assert loaded.graph.checks == lib.graph.checks == [(s, 50, lib.graph.checks[0][2])]
    with pytest.raises(ExecutorError, match="s <= 50"):
        loaded.create_executor()(x=_rand(1, 60, 4))


def test_every_second_row_and_a_reshape_by_a_quotient() -> None:
    """x[:, ::2] and x[:, 1::3] of a symbolic axis are floordiv(s + 1, 2) and floordiv(s + 1, 3) rows; a reshape of
    (n, s) to (-1, 4) has floordiv(n*s, 4) rows, which fit only sizes whose product 4 divides."""
    x = relay.var("x", shape=("n", "s"))
    fn = relay.Function([x], relay.Tuple([relay.strided_slice(x, [0], [2**31 - 1], [2], axes=[1]),
                                          relay.strided_slice(x, [1], [2**31 - 1], [3], axes=[1]),
                                          relay.exp(relay.reshape(x, (-1, 4)))]))
    typed = relay.transform.InferType()(relay.IRModule.from_expr(fn))["main"]
    assert [[str(d) for d in t.shape] for t in typed.checked_type.ret_type.fields] == [
        ["n", "floordiv(s + 1, 2)"], ["n", "floordiv(s + 1, 3)"], ["floordiv(n*s, 4)", "4"]]
    ex = relay.build(fn).create_executor()
    for batch, seq in [(1, 4), (3, 4), (2, 6), (4, 17)]:
        x_ = _rand(batch, seq)
        halves, thirds, rows = ex(x=x_)
        np.testing.assert_array_equal(halves, x_[:, ::2])
        np.testing.assert_array_equal(thirds, x_[:, 1::3])
        np.testing.assert_allclose(rows, np.exp(x_.reshape(-1, 4)), rtol=1e-6)
    with pytest.raises(ExecutorError, match=r"the reshape of \(n, s\) to \(-1, 4\) \(its n\*s elements\) needs "
                                            r"n\*s <= 4\*floordiv\(n\*s, 4\), which the sizes n = 3, s = 5 break"):
        ex(x=_rand(3, 5))
