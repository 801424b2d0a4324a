"""The Relay text format: print -> parse -> print is a fixed point, and parsing rebuilds the same structure."""

from __future__ import annotations

import itertools
import re
import sys
from typing import Any

import attrs
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from kiln import relay
from kiln.errors import KilnError
from kiln.ir.attrs import Attrs, float_value, to_dtype, to_int_tuple
from kiln.ir.dtype import DataType
from kiln.ir.module import IRModule
from kiln.ir.span import Span
from kiln.ir.types import ANY, FuncType, SizeVar, TensorType, TupleType, TypeVar, dim_add, dim_floordiv, dim_mul
from kiln.registry import Op, register_op
from kiln.relay import ParseError, parse
from kiln.relay.analysis import structural_equal
from kiln.relay.expr import Call, Constant, Expr, Function, If, Let, TupleGetItem, Var
from kiln.relay.printer import astext, excerpt
from kiln.relay.visitor import post_order

NUMPY_DTYPES = ["float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool"]


def roundtrip(obj: IRModule | Expr, map_free_vars: bool = True) -> Any:
    """Prints, parses and prints again: the two texts agree and the structures are equal.

    Types in `/* ty=... */` comments are not parsed: a typed input is compared after
    the parsed copy is type-checked again.
    """
    text = astext(obj)
    back = parse(text)
    assert astext(back, show_types=False) == astext(obj, show_types=False)
    if "/* ty=" in text:
        if isinstance(back, IRModule):
            relay.transform.InferType()(back)
        else:
            relay.infer_type(back)
    assert astext(back) == text
    assert structural_equal(obj, back, map_free_vars=map_free_vars)
    return back


def tensor(*shape: Any, dtype: str = "float32", name: str = "x") -> Var:
    return relay.var(name, shape=shape, dtype=dtype)


# ---------------------------------------------------------------------------
# The format
# ---------------------------------------------------------------------------


def test_module_prints_as_tvm_does_with_types() -> None:
    x = tensor(1, 8)
    f = relay.Function([x], relay.add(relay.exp(x), relay.const(1.0)))
    mod = IRModule.from_expr(f)
    relay.infer_type(f)
    assert str(mod) == mod.astext() == astext(mod)
    assert astext(mod) == (
        "def @main(%x: Tensor[(1, 8), float32]) {\n"
        "  %0 = exp(%x) /* ty=Tensor[(1, 8), float32] */;\n"
        "  %1 = add(%0, 1f) /* ty=Tensor[(1, 8), float32] */;\n"
        "  %1\n"
        "}\n"
    )
    assert "ty=" not in astext(mod, show_types=False)
    roundtrip(mod)


def test_parsed_types_come_from_annotations_not_comments() -> None:
    x = tensor(2)
    f = relay.Function([x], relay.negative(x), ret_type=TensorType((2,)))
    relay.infer_type(f)
    back = parse(astext(f))
    assert isinstance(back, Function)
    assert back.params[0].type_annotation == TensorType((2,))
    assert back.ret_type == TensorType((2,))
    assert not back.body.has_type
    assert astext(relay.infer_type(back)) == astext(f)


def test_parse_of_an_expression_text_written_by_hand() -> None:
    f = parse("fn (%x: Tensor[(2,), float32]) { negative(%x) }")
    assert isinstance(f, Function) and isinstance(f.body, Call)
    assert f.body.op is Op.get("negative") and f.body.args[0] is f.params[0]
    nested = parse("fn (%x: float32) {\n  // a comment\n  add(negative(%x), /* inline */ %x)\n}")
    assert isinstance(nested, Function)
    assert nested.params[0].type_annotation == TensorType((), "float32")
    assert isinstance(nested.body, Call) and isinstance(nested.body.args[0], Call)


def test_shared_nodes_print_once_and_stay_shared() -> None:
    x = tensor(3)
    e = relay.exp(x)
    c = relay.const(2.0)
    f = relay.Function([x], relay.multiply(relay.add(e, c), relay.subtract(e, c)))
    text = astext(f)
    assert text.count("exp(") == 1 and text.count("2f") == 1  # the shared literal is bound once
    back = roundtrip(f)
    mul = back.body
    assert mul.args[0].args[0] is mul.args[1].args[0]
    assert mul.args[0].args[1] is mul.args[1].args[1]


def test_var_names_that_clash_or_are_not_identifiers() -> None:
    a, b, c, d = tensor(2, name="x"), tensor(2, name="x"), tensor(2, name="input.1"), tensor(2, name="0")
    f = relay.Function([a, b, c, d], relay.Tuple([a, b, c, d]))
    text = astext(f)
    assert '%x, %x_1, %"input.1", %"0"' in text
    back = roundtrip(f)
    assert [p.name_hint for p in back.params] == ["x", "x_1", "input.1", "0"]
    assert len({id(p) for p in back.params}) == 4


def test_free_vars_are_declared() -> None:
    x, y = tensor(2), tensor(2, name="y")
    e = relay.add(x, y)
    text = astext(e)
    assert text.startswith("free_var %x: Tensor[(2,), float32];\nfree_var %y: Tensor[(2,), float32];\n")
    back = roundtrip(e)
    assert isinstance(back, Call) and all(isinstance(a, Var) for a in back.args)
    assert roundtrip(x).name_hint == "x"


def test_symbolic_and_unknown_dims_round_trip() -> None:
    n = SizeVar("n")
    x = relay.var("x", shape=(n, dim_mul(3, n), None, dim_mul(n, SizeVar("m")), 0))
    f = relay.Function([x], relay.exp(x))
    text = astext(f)
    assert "Tensor[(n, 3*n, ?, m*n, 0), float32]" in text
    back = roundtrip(f)
    assert back.params[0].type_annotation == x.type_annotation
    assert back.params[0].type_annotation.shape[2] is ANY


def test_sums_and_quotients_of_sizes_round_trip() -> None:
    n, s = SizeVar("n"), SizeVar("s")
    dims = (dim_add(s, -1), dim_floordiv(dim_add(s, 1), 2), dim_add(dim_mul(2, dim_floordiv(dim_mul(n, s), 4)), 1))
    f = relay.Function([relay.var("x", shape=dims)], relay.exp(relay.var("y")))
    assert "Tensor[(s - 1, floordiv(s + 1, 2), 2*floordiv(n*s, 4) + 1), float32]" in astext(f)
    assert roundtrip(f).params[0].type_annotation.shape == dims
    with pytest.raises(relay.ParseError, match=r"expected floordiv's divisor \(an int >= 1\), found 'n'"):
        parse("fn (%x: Tensor[(floordiv(s, n),), float32]) { %x }")


def test_types_of_every_kind_round_trip() -> None:
    t = TypeVar("T")
    kinds = [
        TensorType((), "bool"),
        TensorType((3,), "float16"),
        TupleType([]),
        TupleType([TensorType((1,))]),
        TupleType([TensorType((1,)), TupleType([TensorType((), "int64")])]),
        FuncType([TensorType((2,)), t], TensorType((2,))),
        FuncType([t], t, [t]),
    ]
    params = [relay.var(f"p{i}", k) for i, k in enumerate(kinds)]
    back = roundtrip(relay.Function(params, params[0], ret_type=kinds[0]))
    assert [p.type_annotation for p in back.params] == kinds
    assert "fn <T>(T) -> T" in astext(back)


def test_tuples_lets_ifs_nested_functions_and_global_calls() -> None:
    mod = IRModule()
    p = tensor(4, name="p")
    mod["helper"] = relay.Function([p], relay.Tuple([relay.exp(p), p]), ret_type=TupleType([TensorType((4,))] * 2))
    x, c = tensor(4), relay.var("c", shape=(), dtype="bool")
    helper = mod.get_global_var("helper")
    pair = Call(helper, [x])
    first = TupleGetItem(pair, 0)
    a = tensor(4, name="a")
    inner = relay.Function([a], relay.negative(a))
    fv, v = relay.var("f"), relay.var("v")
    only_true = relay.sqrt(first)  # used only in the true branch: printed inside it
    both = relay.abs(first)  # used in both branches: printed before the if
    branch = If(c, relay.add(only_true, both), relay.subtract(both, x))
    body = Let(fv, inner, Let(v, Call(fv, [branch]), relay.Tuple([v, TupleGetItem(pair, 1), relay.Tuple([v])])))
    mod["main"] = relay.Function([x, c], body)
    text = astext(mod)
    assert "@helper(%x)" in text and "%f(" in text and "let %f = fn (%a: Tensor[(4,), float32]) {" in text
    assert re.search(r"\n    %\d+ = sqrt\(", text), text  # indented: inside the branch
    assert re.search(r"\n  %\d+ = abs\(", text), text
    assert re.search(r"= %\d+\.0;", text)
    back = roundtrip(mod)
    assert isinstance(back, IRModule) and list(back) == ["helper", "main"]
    relay.transform.InferType()(back)


def test_let_in_non_tail_position_is_a_braced_block() -> None:
    x, v = tensor(2), relay.var("v")
    let = Let(v, relay.exp(x), relay.add(v, v))
    f = relay.Function([x], relay.multiply(let, let))
    text = astext(f)
    assert "= {\n    let %v = exp(%x);" in text
    back = roundtrip(f)
    assert back.body.args[0] is back.body.args[1]
    nested = relay.Function([x], Let(v, Let(relay.var("w"), x, relay.negative(x)), v))
    roundtrip(nested)


@st.composite
def _random_functions(draw: st.DrawFn) -> Function:
    """A random, well-formed graph of calls, tuples, lets, ifs and closures, with shared nodes."""
    params = [tensor(2, name=f"p{i}") for i in range(draw(st.integers(1, 3)))]
    cond = relay.var("c", shape=(), dtype="bool")
    pool: list[Expr] = list(params)
    pick = st.integers(0, 10**6)

    def any_node() -> Expr:
        return pool[draw(pick) % len(pool)]

    for step in range(draw(st.integers(1, 25))):
        kind = draw(st.sampled_from(["unary", "binary", "tuple", "if", "let", "closure", "const"]))
        if kind == "unary":
            pool.append(relay.negative(any_node()))
        elif kind == "binary":
            pool.append(relay.add(any_node(), any_node()))
        elif kind == "tuple":
            pool.append(TupleGetItem(relay.Tuple([any_node(), any_node()]), draw(st.integers(0, 1))))
        elif kind == "if":
            pool.append(If(cond, any_node(), relay.exp(any_node())))
        elif kind == "let":
            v = relay.var(f"v{step}")
            pool.append(Let(v, any_node(), relay.add(v, any_node())))
        elif kind == "closure":
            a = tensor(2, name="a")
            pool.append(Call(relay.Function([a], relay.multiply(a, any_node())), [any_node()]))
        else:
            pool.append(relay.add(any_node(), relay.const(np.float32([1, draw(st.floats(width=32))]))))
    results = [any_node() for _ in range(draw(st.integers(1, 3)))]
    return relay.Function([*params, cond], results[0] if len(results) == 1 else relay.Tuple(results))


@settings(max_examples=200, deadline=None)
@given(_random_functions(), st.booleans())
def test_random_graphs_round_trip(f: Function, typed: bool) -> None:
    if typed:
        relay.infer_type(f)
    roundtrip(f)


def test_spans_point_into_the_text() -> None:
    f = parse("fn (%x: Tensor[(2,), float32]) {\n  %0 = exp(%x);\n  negative(%0)\n}", "model.relay")
    assert f.span == Span("model.relay", 1, 1)
    assert f.params[0].span == Span("model.relay", 1, 5)
    assert f.body.span == Span("model.relay", 3, 3)
    assert f.body.args[0].span == Span("model.relay", 2, 8)
    assert all(n.span is not None and n.span.source == "model.relay" for n in post_order(f))


def test_excerpt_marks_the_line_of_a_node() -> None:
    x = tensor(2)
    nodes = [x]
    for _ in range(10):
        nodes.append(relay.exp(nodes[-1]))
    f = relay.Function([x], nodes[-1])
    out = excerpt(f, nodes[5], context=2)
    lines = out.splitlines()
    assert len(lines) == 6
    marked = next(i for i, line in enumerate(lines) if line.startswith(">"))
    assert "%4 = exp(%3)" in lines[marked]
    assert set(lines[marked + 1].split("|")[1].strip()) == {"^"}
    assert excerpt(IRModule.from_expr(f), nodes[5]).count(">") == 1
    assert excerpt(f, relay.exp(x)) == ""


# ---------------------------------------------------------------------------
# Ops and attributes
# ---------------------------------------------------------------------------

_CANDIDATES: list[Any] = [1, 0.5, True, "NCHW", (1, 1), ((0, 0), (1, 1)), DataType.of("float16"), (0,), -1, 2]


def _build_attrs(name: str, cls: type) -> Attrs | None:
    """Attrs for `name` from defaults, else from the first mix of simple values the class accepts."""
    required = [f.name for f in attrs.fields(cls) if f.default is attrs.NOTHING]
    for values in itertools.product(_CANDIDATES, repeat=len(required)):
        try:
            return cls.make(name, **dict(zip(required, values, strict=True)))  # type: ignore[attr-defined, no-any-return]  # an Attrs class
        except KilnError:
            continue
    return None


def _varied_attrs(name: str, base: Attrs) -> list[Attrs]:
    """Copies of `base` with one defaulted field changed to another accepted value each."""
    out = []
    for field in attrs.fields(type(base)):
        for value in [*_CANDIDATES, None, False, "NHWC", 3, 1e-3]:
            try:
                changed = type(base).make(name, **{**base.fields(), field.name: value})  # type: ignore[attr-defined]  # an Attrs class
            except KilnError:
                continue
            if changed != base:
                out.append(changed)
                break
    return out


def test_every_registered_op_round_trips() -> None:
    built = []
    for name in Op.list_names():
        op = Op.get(name)
        n = op.num_inputs or 1
        args = [tensor(2, 2, name=f"a{i}") for i in range(n)]
        variants: list[Attrs | None] = [None]
        if op.attrs_type is not None:
            base = _build_attrs(name, op.attrs_type)
            if base is None:
                continue
            variants = [base, *_varied_attrs(name, base)]
        for a in variants:
            f = relay.Function(args, Call(op, args, a))
            back = roundtrip(f)
            assert back.body.attrs == a
            if a is not None:
                assert type(back.body.attrs) is type(a)
        built.append(name)
    tensor_ops = ["negative", "exp", "logical_not", "add", "where", "clip", "cast", "greater_equal", "floor_mod"]
    assert set(tensor_ops) <= set(built)
    assert len(built) >= 0.8 * len(Op.list_names())


@attrs.frozen
class _KindsAttrs(Attrs):
    i: int = attrs.field(default=0)
    f: float = attrs.field(default=0.0, validator=float_value)
    b: bool = attrs.field(default=False)
    s: str = attrs.field(default="")
    n: int | None = attrs.field(default=None)
    t: tuple[int, ...] = attrs.field(default=(), converter=to_int_tuple)
    tt: tuple[tuple[int, ...], ...] = attrs.field(default=())
    d: DataType = attrs.field(default="float32", converter=to_dtype)


@pytest.fixture
def kinds_op() -> Op:
    register_op("test.kinds").set_num_inputs(1).add_argument("data", "Tensor").set_attrs_type(_KindsAttrs)
    return Op.get("test.kinds")


@pytest.mark.parametrize(
    "values",
    [
        {},
        {"i": -7, "f": 2.5, "b": True, "s": 'NCHW "quoted" \\ é\n', "n": 3, "t": (2, 2), "tt": ((0, 0), (1, 1))},
        {"f": float("inf"), "d": DataType.of("float16"), "t": (5,), "tt": ((1, 2, 3),)},
        {"f": -0.0, "i": 2**40, "d": DataType.of("bool"), "s": "float32"},
        {"f": 1e-300, "d": DataType.of("bfloat16")},
    ],
)
def test_every_kind_of_attribute_value_round_trips(kinds_op: Op, values: dict[str, Any]) -> None:
    x = tensor(2)
    a = _KindsAttrs(**values)
    back = roundtrip(relay.Function([x], Call(kinds_op, [x], a)))
    got = back.body.attrs
    assert got == a
    assert {k: type(v) for k, v in got.fields().items()} == {k: type(v) for k, v in a.fields().items()}
    assert repr(got.f) == repr(a.f)


def test_attribute_spelling(kinds_op: Op) -> None:
    x = tensor(2)
    a = _KindsAttrs(i=1, f=0.5, b=True, s="NHWC", n=None, t=(2, 2), tt=((0, 0), (1, 1)), d=DataType.of("float16"))
    text = astext(Call(kinds_op, [x], a))
    assert 'test.kinds(%x, i=1, f=0.5, b=True, s="NHWC", t=[2, 2], tt=[[0, 0], [1, 1]], d=float16)' in text
    nan = parse("fn (%x: float32) { test.kinds(%x, f=nan, n=None) }").body.attrs
    assert np.isnan(nan.f) and nan.n is None


def test_clip_and_cast_attributes() -> None:
    x = tensor(2)
    f = relay.Function([x], relay.cast(relay.clip(x, -1.5, 2.0), "int8"))
    assert "clip(%x, a_min=-1.5, a_max=2.0)" in astext(f) and "dtype=int8" in astext(f)
    back = roundtrip(f)
    assert back.body.attrs.dtype == DataType.of("int8")
    assert parse('fn (%x: float32) { cast(%x, dtype="int16") }').body.attrs.dtype == DataType.of("int16")


# ---------------------------------------------------------------------------
# Constants
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "dtype", "text"),
    [
        (1.0, "float32", "1f"),
        (-0.0, "float32", "-0f"),
        (0.1, "float32", "0.1f"),
        (float("nan"), "float32", "nanf"),
        (float("inf"), "float16", "inff16"),
        (float("-inf"), "float64", "-inff64"),
        (65504.0, "float16", "6.55e+04f16"),
        (1e-300, "float64", "1e-300f64"),
        (3, "int32", "3"),
        (-128, "int8", "-128i8"),
        (-3, "int16", "-3i16"),
        (2**62, "int64", f"{2**62}i64"),
        (255, "uint8", "255u8"),
        (True, "bool", "True"),
    ],
)
def test_scalar_constants_are_exact_literals(value: Any, dtype: str, text: str) -> None:
    const = relay.const(value, dtype)
    assert astext(const) == f"{text}\n"
    back = parse(text)
    assert isinstance(back, Constant)
    assert back.data.dtype == const.data.dtype and back.data.tobytes() == const.data.tobytes()


def test_small_arrays_are_nested_literals() -> None:
    const = relay.const(np.arange(6, dtype=np.int64).reshape(2, 3))
    assert astext(const) == "[[0i64, 1i64, 2i64], [3i64, 4i64, 5i64]]\n"
    assert astext(relay.const(np.array([True, False]))) == "[True, False]\n"
    assert astext(relay.const(np.zeros((1, 1, 1), np.float32))) == "[[[0f]]]\n"
    roundtrip(relay.Function([], relay.const(np.float32([1.5, np.nan, -np.inf]))))


def test_large_odd_and_shared_constants_go_to_metadata() -> None:
    rng = np.random.default_rng(0)
    weight = relay.const(rng.standard_normal((64, 3, 7, 7)).astype(np.float32))
    empty = relay.const(np.zeros((0, 3), np.int8))
    odd_nan = relay.const(np.array([0x7FC00001], np.uint32).view(np.float32))  # a NaN with a payload
    neg_nan = relay.const(-np.float16(np.nan))
    x = tensor(64, 3, 7, 7)
    body = relay.Tuple([relay.add(x, weight), relay.subtract(x, weight), empty, odd_nan, neg_nan])
    f = relay.Function([x], body)
    text = astext(f)
    assert text.count("meta[relay.Constant][0]") == 2
    assert (
        "meta[relay.Constant][3]" in text and "\n#[metadata]\nrelay.Constant[0] float32 (64, 3, 7, 7) base64:" in text
    )
    back = roundtrip(f)
    add, sub = back.body.fields[0], back.body.fields[1]
    assert add.args[1] is sub.args[1]
    for old, new in zip((weight, empty, odd_nan, neg_nan), (add.args[1], *back.body.fields[2:]), strict=True):
        assert new.data.dtype == old.data.dtype and new.data.shape == old.data.shape
        assert new.data.tobytes() == old.data.tobytes()
    assert "#[metadata]" not in astext(f, show_meta_data=False)


def test_byte_order_and_memory_layout_do_not_change_the_text() -> None:
    big = relay.const(np.array([1.5, -2.0], dtype=">f4"))
    fortran = relay.const(np.asfortranarray(np.arange(40, dtype=np.int16).reshape(5, 8)))
    assert astext(big) == "[1.5f, -2f]\n"
    f = relay.Function([], relay.Tuple([big, fortran]))
    back = parse(astext(f))
    assert astext(back) == astext(f)
    assert back.body.fields[0].data.dtype == np.float32 and back.body.fields[0].data.tolist() == [1.5, -2.0]
    assert back.body.fields[1].data.tobytes() == np.ascontiguousarray(fortran.data).tobytes()
    assert big.data.dtype.isnative  # constants keep the machine's byte order
    assert structural_equal(back, f)


def _float_bits(dtype: str) -> st.SearchStrategy[np.ndarray[Any, Any]]:
    """Arrays of any bit patterns (NaN payloads and all) of a float dtype."""
    width = np.dtype(dtype).itemsize
    uint = np.dtype(f"uint{8 * width}")
    return hnp.arrays(uint, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5)).map(
        lambda a: a.view(dtype)
    )


_ANY_CONSTANT = st.sampled_from(NUMPY_DTYPES).flatmap(
    lambda d: st.one_of(
        hnp.arrays(d, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5)),
        *([_float_bits(d)] if d.startswith("float") else []),
    )
)


@settings(max_examples=300, deadline=None)
@given(_ANY_CONSTANT)
def test_constants_of_any_dtype_and_value_round_trip_bit_exactly(data: np.ndarray[Any, Any]) -> None:
    const = Constant(data)
    text = astext(const)
    back = parse(text)
    assert isinstance(back, Constant)
    assert back.data.dtype == data.dtype and back.data.shape == data.shape
    assert back.data.tobytes() == np.ascontiguousarray(data).tobytes()
    assert astext(back) == text


# ---------------------------------------------------------------------------
# Long chains
# ---------------------------------------------------------------------------


def test_a_chain_of_10000_calls_prints_and_parses() -> None:
    x = tensor(4)
    e: Expr = x
    for k in range(10_000):
        e = relay.add(e, relay.const(1.0)) if k % 2 else relay.negative(e)
    f = relay.Function([x], e)
    limit = sys.getrecursionlimit()
    text = astext(f)
    assert text.count("\n") == 10_003
    back = parse(text)
    assert astext(back) == text and structural_equal(f, back)
    assert sys.getrecursionlimit() == limit


def test_a_chain_of_10000_lets_prints_flat_and_parses() -> None:
    x = tensor(4)
    vs = [x] + [relay.var(f"v{k}") for k in range(10_000)]
    body: Expr = vs[-1]
    for k in range(10_000, 0, -1):
        body = Let(vs[k], relay.negative(vs[k - 1]), body)
    f = relay.Function([x], body)
    text = astext(f)
    assert "\n  let %v9999 = negative(%v9998);\n  %v9999\n}" in text
    back = parse(text)
    assert astext(back) == text and structural_equal(f, back)


def test_deep_nesting_of_branches_prints() -> None:
    c = relay.var("c", shape=(), dtype="bool")
    e: Expr = tensor(2)
    for _ in range(3000):
        e = If(c, e, relay.negative(e))
    assert astext(e).count("if (%c)") == 3000


# ---------------------------------------------------------------------------
# Parse errors
# ---------------------------------------------------------------------------

_GOOD = "fn (%x: Tensor[(2,), float32]) {\n  %0 = exp(%x);\n  %0\n}"


def _error(text: str) -> ParseError:
    with pytest.raises(ParseError) as info:
        parse(text, "bad.relay")
    err = info.value
    assert isinstance(err, KilnError) and isinstance(err, ValueError)
    return err


def _caret_under(err: ParseError, fragment: str) -> None:
    """The message shows the faulty line with a caret starting under `fragment`."""
    lines = str(err).splitlines()
    source_line, caret_line = lines[1], lines[2]
    assert fragment in source_line
    assert caret_line.index("^") == source_line.index(fragment)
    assert err.span is not None
    assert lines[0].startswith(f"bad.relay:{err.span.line}:{err.span.column}: ")


@pytest.mark.parametrize(
    ("text", "fragment", "words"),
    [
        (_GOOD.replace("exp(", "epx("), "epx", ["unknown op 'epx'", "did you mean 'exp'"]),
        (_GOOD.replace("exp(%x)", "clip(%x, a_min=0.0, a_mxa=1.0)"), "a_mxa", ["no attribute a_mxa", "'a_max'"]),
        (_GOOD.replace("exp(%x)", "clip(%x, a_min=2.0, a_max=1.0)"), "a_max", ["op clip", "a_max must be"]),
        (_GOOD.replace("exp(%x)", "clip(%x, a_min=0.0, a_max=[1])"), "a_max", ["a_max must be a number"]),
        (_GOOD.replace("exp(%x)", "cast(%x, dtype=flaot16)"), "flaot16", ["attribute value", "'float16'"]),
        (_GOOD.replace("exp(%x)", "exp(%x, a=1)"), "a=", ["op exp takes no attributes"]),
        (_GOOD.replace("exp(%x)", "exp(%y)"), "%y", ["undefined variable %y"]),
        (_GOOD.replace("  %0\n", "  %1\n"), "%1", ["undefined value %1", "'%0'"]),
        (_GOOD.replace("float32", "flaot32"), "flaot32", ["unknown dtype 'flaot32'", "'float32'"]),
        (_GOOD.replace("(2,)", "(2, -1)"), "-1", ["expected a dim"]),
        (_GOOD.replace("exp(%x);", "exp(%x)"), "%0\n", ["expected ';' after the binding of %0"]),
        (_GOOD.replace("}", ""), "", ["expected '}'", "(to close the '{' at 1:32)", "end of input"]),
        (_GOOD.replace("exp(%x)", "exp((%x, %x)"), ";", ["expected ')'", "(to close the '(' at 2:11)"]),
        (_GOOD.replace("exp(%x)", "add(%x, [1f, 2i8])"), "2i8", ["share one dtype"]),
        (_GOOD.replace("exp(%x)", "add(%x, 300u8)"), "300u8", ["300 does not fit in uint8"]),
        (_GOOD.replace("exp(%x)", "add(%x, meta[relay.Constant][0])"), "0]", ["no '#[metadata]'"]),
        (_GOOD.replace("exp(%x)", "exp(%x) $"), "$", ["unexpected character '$'"]),
        (_GOOD.replace("exp(%x)", "exp(%x) /* open"), "/*", ["unterminated comment"]),
        (_GOOD.replace("%0 = exp(%x);", "%0 = exp(%x);\n  %0 = exp(%x);"), "%0 = exp(%x);", ["already defined"]),
    ],
)
def test_parse_errors_point_at_the_fault(text: str, fragment: str, words: list[str]) -> None:
    err = _error(text)
    for word in words:
        assert word in str(err), str(err)
    if fragment:
        line = str(err).splitlines()[1]
        _caret_under(err, fragment.strip("\n") if fragment.strip() else line.strip())


def test_errors_about_functions_and_metadata() -> None:
    err = _error("def @main() {\n  @other()\n}")
    assert "undefined function @other" in str(err)
    _caret_under(err, "@other")
    err = _error("def @f() { () }\ndef @f() { () }")
    assert "defined twice" in str(err)
    good = astext(relay.const(np.zeros(20, np.float32)))
    err = _error(good.replace("base64:", "base64:@@"))
    assert "bad metadata line" in str(err) and str(err).startswith("bad.relay:4:1:")
    err = _error(good.replace("float32 (20,)", "float32 (21,)"))
    assert "needs 84" in str(err)


def test_parse_error_shows_a_window_of_long_lines() -> None:
    long_args = ", ".join(["%x"] * 100)
    err = _error(f"fn (%x: float32) {{ tuple_op({long_args}) }}")
    lines = str(err).splitlines()
    assert "unknown op 'tuple_op'" in lines[0]
    assert len(lines[1]) < 140 and lines[2].strip() == "^" * len("tuple_op")
