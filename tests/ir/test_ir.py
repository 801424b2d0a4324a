"""The IR foundation: dtypes, dims and types, attrs validation, spans, IRModule, the pass infrastructure."""

from __future__ import annotations

import io
from typing import Any

import attrs
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kiln import relay
from kiln.ir.attrs import Attrs, AttrsError, int_range, int_tuple, one_of, to_int_tuple
from kiln.ir.dtype import DTYPES, DataType, DTypeError
from kiln.ir.module import IRModule, ModuleError
from kiln.ir.transform import (
    PassContext,
    PassError,
    PassTimingInstrument,
    PrintIRInstrument,
    Sequential,
    function_pass,
    module_pass,
    register_config,
)
from kiln.ir.types import (
    ANY,
    FuncType,
    IncompleteType,
    SizeVar,
    SumDim,
    SymDim,
    TensorType,
    TupleType,
    dim_add,
    dim_div,
    dim_floordiv,
    dim_mul,
    dim_names,
    dim_prod,
    dim_subst,
    dim_value,
    is_complete,
    parse_dim,
)

# --- dtypes ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_dtypes_convert_to_and_from_numpy(dtype: DataType) -> None:
    assert DataType.of(dtype.numpy()) is DataType.of(dtype.name)
    assert DataType.of(np.zeros(1, dtype.numpy()).dtype) == dtype
    assert str(dtype) == dtype.name


def test_dtype_properties_and_errors() -> None:
    assert DataType.of("float16").is_float and DataType.of("float16").bits == 16
    assert DataType.of("uint8").is_int and DataType.of("bool").is_bool
    assert DataType.of(np.float32) == DataType.of("float32")
    with pytest.raises(DTypeError, match="unknown dtype 'float8'; kiln knows float16"):
        DataType.of("float8")
    with pytest.raises(DTypeError, match="numpy dtype complex64 has no kiln dtype"):
        DataType.of(np.complex64)
    assert DataType.of("bfloat16").numpy() == np.dtype(ml_dtypes.bfloat16)  # numpy has none of its own


# --- dims and types -------------------------------------------------------------------


def test_symbolic_dims_multiply_divide_and_add() -> None:
    n, m = SizeVar("n"), SizeVar("m")
    assert str(dim_mul(n, 12)) == "12*n"
    assert dim_div(dim_mul(n, 12), 4) == dim_mul(n, 3)
    assert dim_div(dim_mul(n, 12), n) == 12
    assert dim_div(12, 5) is None  # cannot be exact
    assert dim_div(n, m) is ANY  # not a monomial
    assert dim_add(n, dim_mul(n, 2)) == dim_mul(n, 3)
    assert dim_add(n, m) == SumDim((m, n)) and str(dim_add(n, m)) == "m + n"  # a concatenation of m and n
    assert str(dim_add(dim_add(n, 3), dim_mul(m, -2))) == "-2*m + n + 3" and dim_add(dim_add(n, 1), -1) == n
    assert dim_div(dim_mul(dim_add(n, 1), 4), 2) == dim_add(dim_mul(n, 2), 2)
    assert dim_div(dim_add(n, 1), 2) is ANY  # (n + 1) // 2: not yet
    assert dim_prod([2, n, 3, m]) == SymDim(6, (("m", 1), ("n", 1)))
    assert dim_mul(ANY, 0) == 0
    assert dim_value(parse_dim("2*n*m + n - 3"), {"n": 2, "m": 5}) == 19


@given(st.integers(1, 50), st.lists(st.sampled_from(["n", "m", "batch"]), max_size=3), st.integers(-9, 9))
def test_dims_print_and_parse_back(coeff: int, names: list[str], const: int) -> None:
    d = dim_prod([coeff, *[SizeVar(x) for x in names]])
    assert parse_dim(str(d)) == d
    assert parse_dim(str(dim_add(d, const))) == dim_add(d, const)


def test_floor_quotients_of_dims_stay_symbolic_and_canonical() -> None:
    n, s = SizeVar("n"), SizeVar("s")
    half = dim_floordiv(dim_add(s, 1), 2)
    assert str(half) == "floordiv(s + 1, 2)" and isinstance(half, SymDim) and dim_names(half) == ("s",)
    assert dim_floordiv(dim_add(dim_mul(n, 2), 4), 2) == dim_add(n, 2)  # exact term by term
    assert str(dim_floordiv(dim_add(dim_mul(n, 2), 3), 2)) == "n + 1"  # floor((2n + 3) / 2)
    assert str(dim_floordiv(dim_mul(n, 12), 5)) == "2*n + floordiv(2*n, 5)"  # whole part out, the rest in [0, 5)
    assert str(dim_mul(half, 2)) == "2*floordiv(s + 1, 2)"
    assert dim_subst(dim_add(half, n), {"s": 6}) == dim_add(n, 3) and dim_subst(half, {"n": 1}) == half
    assert s // 2 == dim_floordiv(s, 2) and dim_add(s, 1) // 2 == half
    with pytest.raises(ValueError, match="not a dim"):
        parse_dim("floordiv(s + 1)")


@given(st.lists(st.tuples(st.integers(-9, 9), st.sampled_from(["n", "s", "n*s"])), min_size=1, max_size=3),
       st.integers(0, 20), st.integers(1, 7), st.integers(0, 30), st.integers(0, 30))
def test_a_quotient_has_the_value_of_the_floor_and_prints_and_parses_back(
        terms: list[tuple[int, str]], const: int, k: int, n: int, s: int) -> None:
    d: Any = const
    for c, name in terms:
        d = dim_add(d, dim_mul(parse_dim(name), c))
    q = dim_floordiv(d, k)
    env = {"n": n, "s": s}
    if isinstance(d, int) or dim_value(d, env) >= 0:
        assert dim_value(q, env) == dim_value(d, env) // k
    assert parse_dim(str(q)) == q
    assert parse_dim(str(dim_add(dim_mul(q, 3), 1))) == dim_add(dim_mul(q, 3), 1)


def test_tensor_types_print_and_compare() -> None:
    t = TensorType((1, SizeVar("n"), None), "float16")
    assert str(t) == "Tensor[(1, n, ?), float16]"
    assert str(TensorType((3,), "int8")) == "Tensor[(3,), int8]"
    assert t == TensorType((1, "n", ANY), "float16")
    assert hash(t) == hash(TensorType((1, "n", ANY), "float16"))
    assert not t.is_static and TensorType((2, 3)).concrete_shape == (2, 3)
    with pytest.raises(ValueError, match="a dim is an int >= 0"):
        TensorType((-1,))
    with pytest.raises(TypeError, match="a dim is an int >= 0"):
        TensorType((1.5,))


def test_composite_types() -> None:
    t = TensorType((2,))
    assert str(TupleType([t, t])) == "(Tensor[(2,), float32], Tensor[(2,), float32])"
    assert str(FuncType([t], t)) == "fn (Tensor[(2,), float32]) -> Tensor[(2,), float32]"
    assert not is_complete(TupleType([t, IncompleteType()]))
    assert IncompleteType() != IncompleteType()


# --- attrs ------------------------------------------------------------------------------


@attrs.frozen
class PoolAttrs(Attrs):
    pool_size: tuple[int, ...] = attrs.field(converter=to_int_tuple, validator=int_tuple(2, lo=1))
    layout: str = attrs.field(default="NCHW", validator=one_of("NCHW", "NHWC"))
    groups: int = attrs.field(default=1, validator=int_range(1))


def test_attrs_errors_name_the_op_the_field_the_allowed_values_and_the_value() -> None:
    assert PoolAttrs.make("nn.pool", pool_size=[2, 2]).pool_size == (2, 2)
    with pytest.raises(AttrsError, match="op nn.pool: attribute layout must be one of 'NCHW', 'NHWC', got 'NCWH'"):
        PoolAttrs.make("nn.pool", pool_size=(2, 2), layout="NCWH")
    with pytest.raises(AttrsError, match=r"attribute pool_size must be a list of 2 ints >= 1, got \(2, 0\)"):
        PoolAttrs.make("nn.pool", pool_size=(2, 0))
    with pytest.raises(AttrsError, match="attribute groups must be an int >= 1, got 0"):
        PoolAttrs.make("nn.pool", pool_size=(2, 2), groups=0)
    with pytest.raises(AttrsError, match=r"op nn.pool has no attribute layuot \(did you mean 'layout'"):
        PoolAttrs.make("nn.pool", pool_size=(2, 2), layuot="NCHW")
    with pytest.raises(AttrsError, match="op nn.pool: .*pool_size"):
        PoolAttrs.make("nn.pool")


# --- spans ------------------------------------------------------------------------------


def test_expressions_built_in_python_carry_their_call_site() -> None:
    x = relay.var("x", shape=(2,))
    y = relay.exp(x)
    assert y.span is not None and y.span.source.endswith("test_ir.py")
    assert x.span is not None and y.span.line == x.span.line + 1


# --- modules and passes -------------------------------------------------------------------


def _module() -> IRModule:
    x = relay.var("x", shape=(2, 3))
    return IRModule.from_expr(relay.Function([x], relay.exp(x)))


def test_module_lookup() -> None:
    mod = _module()
    assert "main" in mod and list(mod) == ["main"]
    gvar = mod.get_global_var("main")
    assert mod[gvar] is mod["main"]
    with pytest.raises(ModuleError, match="module has no function 'mian' \\(did you mean 'main'"):
        mod["mian"]


def test_passes_respect_opt_level_disabled_and_required() -> None:
    ran: list[str] = []

    @module_pass(opt_level=3, name="Expensive")
    def expensive(mod: IRModule, ctx: PassContext) -> IRModule:
        ran.append("Expensive")
        return mod

    @function_pass(opt_level=1, name="Cheap")
    def cheap(func: relay.Function, mod: IRModule, ctx: PassContext) -> relay.Function:
        ran.append("Cheap")
        return func

    seq = Sequential([expensive, cheap])
    seq(_module())
    assert ran == ["Cheap"]  # default opt_level 2
    ran.clear()
    with PassContext(opt_level=3, disabled_pass=["Cheap"]):
        seq(_module())
    assert ran == ["Expensive"]
    ran.clear()
    with PassContext(opt_level=0, required_pass=["Expensive"]):
        seq(_module())
    assert ran == ["Expensive"]


def test_instruments_time_and_dump_every_pass(tmp_path: object) -> None:
    timing = PassTimingInstrument()
    stream = io.StringIO()
    with PassContext(instruments=[timing, PrintIRInstrument(stream=stream)]):
        mod = Sequential([relay.transform.InferType()])(_module())
    assert [name for name, _ in timing.timings] == ["InferType", "Sequential"]
    assert "InferType" in timing.render()
    assert "// IR after InferType" in stream.getvalue()
    assert mod["main"].checked_type == FuncType([TensorType((2, 3))], TensorType((2, 3)))


def _breaking(mod: IRModule, ctx: PassContext) -> IRModule:
    x = relay.var("x", shape=(2, 3))
    stray = relay.var("stray", shape=(2, 3))
    out = IRModule()
    out["main"] = relay.Function([x], relay.add(x, stray))
    return out


def test_verify_catches_a_pass_that_breaks_the_module() -> None:
    breaks = module_pass(name="Breaks", verifier=relay.transform.verify)(_breaking)
    breaks(_module())  # without verification nothing notices
    with PassContext(verify=True), pytest.raises(PassError, match="(?s)after pass Breaks.*free variables: %stray"):
        breaks(_module())


def test_verify_is_never_silently_skipped() -> None:
    unchecked = module_pass(name="Unchecked")(_breaking)  # built without a verifier
    with PassContext(verify=True), pytest.raises(PassError, match=r"PassContext\(verify=True\) after pass Unchecked: "
                                                               r"the pass has no verifier"):
        unchecked(_module())
    with PassContext(verify=relay.transform.verify), pytest.raises(PassError, match="free variables: %stray"):
        unchecked(_module())  # the context's verifier checks every pass
    assert relay.transform.FoldConstant().verifier is relay.transform.verify  # every Relay pass carries one


def test_pass_context_config_keys_are_checked() -> None:
    register_config("test.max_depth", int, "a test key")
    assert PassContext(config={"test.max_depth": 3}).config["test.max_depth"] == 3
    with pytest.raises(PassError, match="unknown PassContext config key 'test.max_dpth'"):
        PassContext(config={"test.max_dpth": 3})
    with pytest.raises(PassError, match="config test.max_depth expects int"):
        PassContext(config={"test.max_depth": "3"})
    with pytest.raises(PassError, match="opt_level must be an int in"):
        PassContext(opt_level=7)
