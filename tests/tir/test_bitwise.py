"""The loop IR's bitwise nodes (`&`, `|`, `^`, `~`, `<<`, `>>`): construction, folding, the simplifier's
identities and ranges, the printer, the interpreter, and both back ends against numpy.

A shift is defined for every amount as numpy defines it (the amount read as unsigned; from the bit width on
every bit is shifted out, leaving 0, or -1 for a negative value shifted right), so the edge values below are
negative amounts, the width, and the width minus one. LLVM runs on the host; CUDA C is compiled to PTX for
sm_90 and run through the host stand-in of tests/cuda_standin.py.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import cuda_standin
import numpy as np
import pytest
from cuda_standin import needs_gxx
from tir_interp import eval_expr

import kiln
from kiln import relay, te, tir
from kiln.codegen import nvrtc
from kiln.relay.op import tensor
from kiln.tir.simplify import Analyzer, simplify

INTS = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]
SM90 = "cuda -arch=sm_90"
# name -> (loop-IR builder, numpy function)
OPS: dict[str, tuple[Callable[[Any, Any], Any], Callable[[Any, Any], Any]]] = {
    "and": (lambda a, b: a & b, np.bitwise_and),
    "or": (lambda a, b: a | b, np.bitwise_or),
    "xor": (lambda a, b: a ^ b, np.bitwise_xor),
    "not": (lambda a, b: ~a, lambda a, b: np.invert(a)),
    "shl": (lambda a, b: a << b, np.left_shift),
    "shr": (lambda a, b: a >> b, np.right_shift),
}


def _values(dtype: str, n: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """Operands with the dtype's extremes, and shift amounts of every kind: 0, in range, width - 1, the
    width, past it, and (signed) negative ones."""
    info = np.iinfo(dtype)
    bits = info.bits
    rng = np.random.default_rng(bits + (info.min < 0))
    edges = [info.min, info.max, 0, 1, -1 if info.min < 0 else 2, info.max // 3, info.min // 3 - 1 if info.min else 6]
    a = np.concatenate([np.array(edges, dtype), rng.integers(info.min, info.max, n - len(edges), dtype, True)])
    amounts = [0, 1, bits - 1, bits, bits + 1, min(info.max, 2 * bits + 3), info.max, bits // 2]
    if info.min < 0:
        amounts += [-1, -bits, info.min, -(bits - 1)]
    s = np.resize(np.array(amounts, dtype), n)
    return a, rng.permutation(s)


def _want(name: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    out: np.ndarray = OPS[name][1](a, b)
    return out


# --- construction and folding ----------------------------------------------------------------------


def test_operators_build_bitwise_nodes_and_refuse_floats_naming_the_node() -> None:
    x, y = tir.Var("x", "int32"), tir.Var("y", "int32")
    assert isinstance(x & y, tir.BitAnd) and isinstance(x | 3, tir.BitOr) and isinstance(1 << x, tir.ShiftLeft)
    assert isinstance(~x, tir.BitXor) and str(~x) == "x ^ -1"
    assert (x >> y).dtype == "int32" and (tir.Var("p", "bool") & tir.Var("q", "bool")).dtype == "bool"
    f = tir.Var("f", "float32")
    with pytest.raises(tir.TIRError, match=r"BitAnd of float32: bitwise operations take integers or bools"):
        _ = f & f
    with pytest.raises(tir.TIRError, match=r"ShiftLeft of bool"):
        _ = tir.Var("p", "bool") << tir.Var("q", "bool")
    with pytest.raises(tir.TIRError, match=r"bitwise_not of float32"):
        tir.bitwise_not(f)
    with pytest.raises(tir.TIRError, match=r"BitXor of int32 and int64"):
        _ = x ^ tir.Var("z", "int64")


@pytest.mark.parametrize("dtype", INTS)
def test_constants_fold_to_what_numpy_computes(dtype: str) -> None:
    a, b = _values(dtype, 24)
    for name, (build, _) in OPS.items():
        want = _want(name, a, b)
        for x, y, w in zip(a.tolist(), b.tolist(), want.tolist(), strict=True):
            got = build(tir.const(x, dtype), tir.const(y, dtype))
            assert isinstance(got, tir.IntImm) and got.dtype == dtype, (name, x, y)
            assert got.value == w, f"{dtype} {x} {name} {y}: folded {got.value}, numpy {w}"


def test_bool_bitwise_ops_fold_as_logic() -> None:
    t, f = tir.const(True), tir.const(False)
    assert [(t & f).value, (t | f).value, (t ^ t).value, (~t).value, (~f).value] == [0, 1, 0, 0, 1]


# --- simplifier, printer, interpreter --------------------------------------------------------------


def test_simplifier_drops_identities_and_keeps_the_rest() -> None:
    x, y = tir.Var("x", "int32"), tir.Var("y", "uint8")
    zero = tir.const(0, "int32")
    assert str(simplify(x & zero)) == "0" and str(simplify(x ^ x)) == "0"
    assert simplify(x | zero) is x and simplify(x & -1) is x and simplify(x << zero) is x
    assert simplify(x & x) is x and str(simplify(zero >> x)) == "0"
    assert str(simplify(y & tir.const(255, "uint8"))) == "y"
    assert str(simplify(((x & 7) + 1) - 1)) == "x & 7"  # an atom of the linear form
    assert str(simplify((x | 1) ^ tir.const(0, "int32"))) == "x | 1"


def test_ranges_of_masks_and_shifts_decide_comparisons() -> None:
    x, s = tir.Var("x", "int32"), tir.Var("s", "int32")
    ana = Analyzer()
    assert ana.interval(x & 15) == (0, 15)
    assert str(simplify((x & 15) < 16)) == "True" and str(simplify((x & 15) >= 0)) == "True"
    with ana.bound(x, tir.const(0), tir.const(100)):
        assert ana.interval(x >> s) == (0, 100)
        assert ana.interval(x | 3) == (0, 127)
    assert ana.interval(x << 1) == (None, None)  # no rule: the int32 range is not modelled
    assert str(simplify((x & 15) < 15)) == "x & 15 < 15"


def test_printer_parenthesizes_as_python_binds() -> None:
    x, y, z = (tir.Var(n, "int32") for n in "xyz")
    assert str((x | y) & z) == "(x | y) & z"
    assert str(x | (y & z)) == "x | y & z"
    assert str((x + y) << 2) == "x + y << 2"
    assert str(x + (y << 2)) == "x + (y << 2)"
    assert str((x ^ y) < z) == "x ^ y < z"  # Python's `^` binds tighter than `<`
    assert str(x >> (y >> z)) == "x >> (y >> z)"
    env = {"x": 13, "y": 6, "z": 3}
    for e in [(x | y) & z, x | (y & z), (x + y) << 2, x ^ y ^ z, x >> (y >> z), (x - y) & -x, (x ^ y) < z]:
        assert eval(str(e), {}, env) == eval_expr(e, {x: 13, y: 6, z: 3}), str(e)


@pytest.mark.parametrize("dtype", ["int8", "uint16", "int64", "uint64"])
def test_interpreter_agrees_with_folding(dtype: str) -> None:
    a, b = _values(dtype, 20)
    x, y = tir.Var("x", dtype), tir.Var("y", dtype)
    for name, (build, _) in OPS.items():
        for p, q in zip(a.tolist(), b.tolist(), strict=True):
            folded = build(tir.const(p, dtype), tir.const(q, dtype))
            assert eval_expr(build(x, y), {x: p, y: q}) == folded.value, (name, p, q)


# --- LLVM --------------------------------------------------------------------------------------------


def _kernel(dtype: str, n: int, amount: int | None = None, vector: bool = True) -> tuple[te.Schedule, list[Any]]:
    """Six outputs, one per op, of A and B (or of A and the constant `amount`)."""
    A, B = te.placeholder((n,), dtype, name="A"), te.placeholder((n,), dtype, name="B")

    def body(build: Callable[[Any, Any], Any]) -> Callable[[Any], Any]:
        return lambda i: build(A[i], B[i] if amount is None else tir.const(amount, dtype))

    outs = [te.compute((n,), body(build), name=f"C_{name}") for name, (build, _) in OPS.items()]
    s = te.create_schedule(outs)
    if vector:
        for c in outs:
            s[c].vectorize(s[c].split(c.op.axis[0], factor=16)[1])
    return s, [A, B, *outs]


def _run(mod: Any, a: np.ndarray, b: np.ndarray) -> list[np.ndarray]:
    outs = [np.zeros_like(a) for _ in OPS]
    mod(a, b, *outs)
    return outs


@pytest.mark.parametrize("dtype", INTS)
def test_llvm_matches_numpy_for_every_amount(dtype: str) -> None:
    a, b = _values(dtype, 70)  # 70: whole vectors of 16 and a tail
    mod = kiln.build(*_kernel(dtype, a.size), target="llvm")
    for name, got in zip(OPS, _run(mod, a, b), strict=True):
        np.testing.assert_array_equal(got, _want(name, a, b), err_msg=f"{dtype} {name}")


@pytest.mark.parametrize("dtype", ["int8", "int32", "int64", "uint32"])
def test_llvm_scalar_shifts_past_the_width_are_guarded(dtype: str) -> None:
    # x86's vector shifts give numpy's answer past the width by themselves; its scalar ones mask the amount
    # (1 << 32 would be 1), so one element at a time shows whether the guard is there
    mod = kiln.build(*_kernel(dtype, 1, vector=False), target="llvm")
    a, b = _values(dtype, 24)
    for x, y in zip(a, b, strict=True):
        one_a, one_b = np.array([x], dtype), np.array([y], dtype)
        for name, got in zip(OPS, _run(mod, one_a, one_b), strict=True):
            assert got[0] == _want(name, one_a, one_b)[0], f"{dtype} {x} {name} {y}: got {got[0]}"


@pytest.mark.parametrize(("dtype", "amount"), [("int32", 5), ("int32", 32), ("int8", -1), ("uint64", 63),
                                                ("uint16", 16), ("int64", 64)])
def test_llvm_constant_amounts_match_numpy(dtype: str, amount: int) -> None:
    a, _ = _values(dtype, 35)
    b = np.full_like(a, amount)
    mod = kiln.build(*_kernel(dtype, a.size, amount), target="llvm")
    for name, got in zip(OPS, _run(mod, a, b), strict=True):
        np.testing.assert_array_equal(got, _want(name, a, b), err_msg=f"{dtype} {name} {amount}")


def test_llvm_int32_and_of_a_vectorized_loop_is_a_vector_and() -> None:
    A, B = te.placeholder((256,), "int32", name="A"), te.placeholder((256,), "int32", name="B")
    C = te.compute((256,), lambda i: A[i] & B[i], name="C")
    s = te.create_schedule([C])
    s[C].vectorize(s[C].split(C.op.axis[0], factor=16)[1])
    ll = kiln.build(s, [A, B, C], target="llvm").get_source("ll")
    assert re.search(r"= and <(4|8|16) x i32>", ll), ll
    assert not re.search(r"\b(udiv|urem|sdiv|srem)\b", ll)


def test_llvm_shifts_use_the_native_instruction_guarded_only_where_needed() -> None:
    def source(dtype: str) -> str:
        A, B = te.placeholder((64,), dtype, name="A"), te.placeholder((64,), dtype, name="B")
        outs = [te.compute((64,), lambda i: A[i] << B[i], name="L"),
                te.compute((64,), lambda i: A[i] >> B[i], name="R"), te.compute((64,), lambda i: A[i] >> 3, name="K")]
        return kiln.build(te.create_schedule(outs), [A, B, *outs], target="llvm").get_source("ll")

    ll = {dtype: source(dtype) for dtype in ("int32", "uint32")}
    assert re.search(r"\bashr\b", ll["int32"]) and not re.search(r"\blshr\b", ll["int32"])
    assert re.search(r"\blshr\b", ll["uint32"]) and re.search(r"\bshl\b", ll["uint32"])
    assert not re.search(r"\b(udiv|urem|sdiv|srem|mul)\b", ll["int32"] + ll["uint32"])


# --- CUDA C -------------------------------------------------------------------------------------------


def _cuda_kernel(dtype: str, n: int) -> tuple[te.Schedule, list[Any]]:
    s, args = _kernel(dtype, n, vector=False)
    for c in args[2:]:
        bx, tx = s[c].split(c.op.axis[0], factor=32)
        s[c].bind(bx, te.thread_axis("blockIdx.x"))
        s[c].bind(tx, te.thread_axis("threadIdx.x"))
    return s, args


@pytest.mark.parametrize("dtype", INTS)
def test_cuda_source_uses_c_operators_and_guarded_shifts_and_compiles_to_ptx(dtype: str) -> None:
    src = kiln.build(*_cuda_kernel(dtype, 40), target=SM90).get_source("cuda")
    assert re.search(r"= A\[[^\]]+\] & B\[", src) and re.search(r"= A\[[^\]]+\] \| B\[", src)
    assert "kiln_shl<" in src and ("kiln_shr<" if dtype.startswith("u") else "kiln_sar<") in src
    ptx = nvrtc.compile_ptx(src, "sm_90")
    ptx = ptx if isinstance(ptx, str) else ptx.decode()
    assert ".target sm_90" in ptx and re.search(r"\bshl\.b(16|32|64)\b", ptx)
    assert re.search(r"\bshr\.[us](16|32|64)\b", ptx) and re.search(r"\band\.b(16|32|64)\b", ptx)


@needs_gxx
@pytest.mark.parametrize("dtype", ["int8", "uint16", "int32", "uint64", "int64"])
def test_cuda_matches_numpy_on_the_host_stand_in(monkeypatch: pytest.MonkeyPatch, tmp_path: Any, dtype: str) -> None:
    cuda_standin.install(monkeypatch, tmp_path)
    a, b = _values(dtype, 40)
    mod = kiln.build(*_cuda_kernel(dtype, a.size), target=SM90)
    for name, got in zip(OPS, _run(mod, a, b), strict=True):
        np.testing.assert_array_equal(got, _want(name, a, b), err_msg=f"{dtype} {name}")


# --- the Relay ops compile to the nodes ----------------------------------------------------------------


def test_relay_bitwise_ops_lower_to_one_node_each_not_to_division() -> None:
    x, y = relay.var("x", shape=(5,), dtype="int64"), relay.var("y", shape=(5,), dtype="int64")
    ops = [tensor.bitwise_and, tensor.bitwise_or, tensor.bitwise_xor, tensor.left_shift, tensor.right_shift]
    f = relay.Function([x, y], relay.Tuple([op(x, y) for op in ops] + [tensor.bitwise_not(x)]))
    lib = relay.build(f, target="llvm")
    text = "\n".join(k.get_source("tir") for k in lib.kernels)
    for symbol in (" & ", " | ", " ^ ", " << ", " >> "):
        assert symbol in text, symbol
    assert "//" not in text.replace("# ", "") and " % " not in text
    a = np.array([-5, 7, 2**62, -(2**63), 3], "int64")
    b = np.array([1, 63, 64, -1, 0], "int64")
    got = lib.create_executor()(x=a, y=b)
    want = [np.bitwise_and(a, b), np.bitwise_or(a, b), np.bitwise_xor(a, b), np.left_shift(a, b),
            np.right_shift(a, b), np.invert(a)]
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(np.asarray(g), w)
