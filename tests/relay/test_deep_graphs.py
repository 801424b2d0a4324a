"""Deep and wide graphs: compile time and memory linear in the graph, no recursion per node.

The shapes that used to break: a diamond `y = tanh(y*y + y)` repeated (fusion
inlined the shared `y` into a 3**depth-node expression), long chains (loop IR
expressions as deep as the fused group, printed and simplified recursively),
nested tuples (types as deep as the graph, resolved recursively), a value with
thousands of consumers, and long chains of let-bound values in loop IR. Each is
type-checked, fused, printed, parsed back and built, and its result compared
with numpy (and with the reference interpreter).
"""

from __future__ import annotations

import time

import numpy as np
import pytest

import kiln
from kiln import relay, tir
from kiln.codegen import cuda
from kiln.ir.module import IRModule
from kiln.ir.transform import PassContext
from kiln.registry import Op
from kiln.relay.backend.build_module import optimize
from kiln.relay.backend.te_compiler import _Lowerer
from kiln.relay.expr import Call, Function
from kiln.relay.transform.fuse_ops import DEFAULT_MAX_DEPTH
from kiln.relay.visitor import post_order
from kiln.target import Target
from kiln.testing.compare import compare
from kiln.tir.bounds_check import OutOfBoundsError
from kiln.tir.pipeline import optimize_tir

RNG = np.random.default_rng(13)
SHAPE = (4, 8)
HANG_GUARD_S = 120  # not a benchmark: the exponential versions never finished


def x_var() -> relay.Var:
    return relay.var("x", shape=SHAPE, dtype="float32")


def diamond(depth: int) -> Function:
    """`y = tanh(y*y + y)`, `depth` times: each `y` is read three times (tanh keeps it bounded)."""
    x = x_var()
    y: relay.Expr = x
    for _ in range(depth):
        y = relay.tanh(relay.add(relay.multiply(y, y), y))
    return relay.Function([x], y)


def diamond_ref(x: np.ndarray, depth: int) -> np.ndarray:
    y = x.astype(np.float64)
    for _ in range(depth):
        y = np.tanh(y * y + y)
    return y


def rand() -> np.ndarray:
    return RNG.uniform(-1, 1, SHAPE).astype("float32")


def typed(func: Function) -> IRModule:
    return relay.transform.InferType()(IRModule.from_expr(func))


def round_trips(mod: IRModule) -> str:
    """Prints `mod`, parses it back, types and prints that: the same text both times."""
    text = str(mod)
    again = str(relay.transform.InferType()(relay.parse(text)))
    assert again == text
    return text


def primitive_functions(func: Function) -> list[Function]:
    """The primitive functions relay.build compiles for `func` (after its own passes)."""
    main = optimize(func)["main"]
    assert isinstance(main, Function)
    return [n.op for n in post_order(main.body)
            if isinstance(n, Call) and isinstance(n.op, Function) and n.op.is_primitive]


def loop_ir(func: Function) -> str:
    # compiled, not loaded from the library cache (a loaded kernel keeps its signature, not its loop IR)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KILN_CACHE", "0")
        (lib_kernel,) = relay.build(func).kernels
    return str(lib_kernel.func)


# -- the diamond ---------------------------------------------------------------------------


def test_a_30_deep_diamond_builds_and_matches_numpy_and_the_interpreter() -> None:
    func = diamond(30)
    start = time.perf_counter()
    lib = relay.build(func)
    assert time.perf_counter() - start < HANG_GUARD_S
    assert len(lib.kernels) == 1  # the 90 ops are one fused kernel
    x = rand()
    got = lib.create_executor()(x=x)
    np.testing.assert_allclose(got, diamond_ref(x, 30), rtol=1e-5, atol=1e-6)
    ref = relay.create_executor("debug", IRModule.from_expr(func))(x=x)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


def test_the_loop_ir_of_a_diamond_grows_linearly_with_its_depth() -> None:
    # each level's value is a let, computed once and read three times; unshared, depth 8 was
    # a tree of 3**8 copies (866K characters of loop IR at depth 9)
    sizes = {d: len(loop_ir(diamond(d))) for d in (4, 8, 12)}
    assert sizes[12] - sizes[8] == pytest.approx(sizes[8] - sizes[4], rel=0.1)
    assert sizes[12] < 3 * sizes[4]
    text = loop_ir(diamond(12))
    assert text.count("tanh(") == 12
    assert text.count(" = tanh(") == 12  # 11 lets and the store


def test_a_diamond_compiles_each_shared_value_once_in_cuda_source() -> None:
    (prim,) = primitive_functions(diamond(6))
    target = Target("cuda -arch=sm_90")
    sch, inputs, outs = _Lowerer(prim, target).run()
    func = kiln.te.lower(sch, [*inputs, *outs], name="diamond")
    func = optimize_tir(func)
    source = cuda.generate(func, target).source
    assert source.count("tanhf(") == 6  # (3**6 - 1) / 2 = 364 when the DAG was unfolded


def test_a_10000_node_diamond_type_checks_fuses_prints_parses_and_builds() -> None:
    depth = 3334  # three ops a level
    func = diamond(depth)
    mod = typed(func)
    round_trips(mod)
    groups = primitive_functions(func)
    assert len(groups) == -(-3 * depth // DEFAULT_MAX_DEPTH)
    x = rand()
    got = relay.build(func).create_executor()(x=x)
    np.testing.assert_allclose(got, diamond_ref(x, depth), rtol=1e-5, atol=1e-6)


# -- chains and fan-out ----------------------------------------------------------------------


def test_a_10000_op_chain_type_checks_fuses_prints_parses_and_builds() -> None:
    x = x_var()
    y: relay.Expr = x
    for _ in range(10_000):
        y = relay.tanh(y)  # 256 to a fused group: its loop IR was one expression 256 calls deep
    func = relay.Function([x], y)
    round_trips(typed(func))
    data = rand()
    want = data.astype(np.float64)
    for _ in range(10_000):
        want = np.tanh(want)
    got = relay.build(func).create_executor()(x=data)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_one_value_read_by_10000_consumers_type_checks_fuses_prints_and_parses() -> None:
    def fan_out(width: int) -> Function:
        x = x_var()
        t = relay.tanh(x)
        acc: relay.Expr = relay.add(t, relay.const(0.0, "float32"))
        for k in range(1, width):
            acc = relay.maximum(acc, relay.multiply(t, relay.const(float(k % 7) / 7, "float32")))
        return relay.Function([x], acc)

    text = round_trips(typed(fan_out(10_000)))
    assert text.count("tanh(") == 1
    data = rand()
    t = np.tanh(data.astype(np.float64))
    want = np.maximum.reduce([t, *(t * (k % 7) / 7 for k in range(1, 500))])
    got = relay.build(fan_out(500)).create_executor()(x=data)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_chain_of_1000_reshapes_builds_and_matches_numpy() -> None:
    # each fused reshape divides and takes the remainder of the last one's flat index: the
    # simplifier bounded each nested division from both sides per level (6 reshapes took 22 s)
    x = relay.var("x", shape=(4, 6), dtype="float32")
    y: relay.Expr = x
    for k in range(1_000):
        y = relay.reshape(y, (6, 4) if k % 2 == 0 else (4, 6))
        if k % 3 == 0:
            y = relay.negative(y)
    func = relay.Function([x], relay.reshape(y, (6, 4)))
    start = time.perf_counter()
    lib = relay.build(func)
    assert time.perf_counter() - start < HANG_GUARD_S
    data = RNG.uniform(-1, 1, (4, 6)).astype("float32")
    want = (-1.0) ** len(range(0, 1_000, 3)) * data.reshape(6, 4)
    np.testing.assert_array_equal(lib.create_executor()(x=data), want)


# -- nested tuples ---------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [1_000, 10_000])
def test_nested_tuples_type_check_print_parse_and_build(depth: int) -> None:
    x = x_var()
    y: relay.Expr = relay.tanh(x)
    for _ in range(depth):
        y = relay.Tuple([y])
    for _ in range(depth):
        y = relay.TupleGetItem(y, 0)
    func = relay.Function([x], relay.add(y, relay.const(1.0, "float32")))
    mod = typed(func)
    text = round_trips(mod)
    assert max(len(line) for line in text.splitlines()) < 1_000  # a type comment is cut short
    data = rand()
    got = relay.build(func).create_executor()(x=data)
    np.testing.assert_allclose(got, np.tanh(data.astype(np.float64)) + 1, rtol=1e-6)


def test_compare_checks_a_result_nested_2000_tuples_deep() -> None:
    x = x_var()
    y: relay.Expr = relay.tanh(x)
    for _ in range(2_000):
        y = relay.Tuple([y])
    func = relay.Function([x], y)
    data = rand()
    assert compare(func, {"x": data}) is None
    ops = [n.op.name for n in post_order(func.body) if isinstance(n, Call) and isinstance(n.op, Op)]
    assert ops == ["tanh"]


# -- loop IR ---------------------------------------------------------------------------------


def let_chain_func(n: int) -> tir.PrimFunc:
    """`B[i] = A[i] + 1 + 1 + ... (n times)`, each partial sum a let."""
    A, B = tir.buffer("A", (8,)), tir.buffer("B", (8,))
    i = tir.Var("i")
    vs = [tir.Var(f"v{k}", "float32") for k in range(n + 1)]
    body: tir.Stmt = tir.BufferStore(B, vs[-1], [i])
    for k in reversed(range(1, n + 1)):
        body = tir.LetStmt(vs[k], vs[k - 1] + 1.0, body)
    body = tir.LetStmt(vs[0], A.load(i), body)
    return tir.PrimFunc("lets", [A, B], tir.for_range(i, 8, body))


def test_a_chain_of_3000_lets_simplifies_prints_and_compiles() -> None:
    func = let_chain_func(3_000)
    assert str(func).count(" = ") == 3_002
    mod = kiln.build(func)
    a, b = rand()[0], np.zeros(8, "float32")
    mod(a, b)
    np.testing.assert_allclose(b, a + 3_000, rtol=1e-5)


def test_kiln_build_binds_the_shared_values_of_hand_built_loop_ir() -> None:
    A, B = tir.buffer("A", (8,)), tir.buffer("B", (8,))
    i = tir.Var("i")
    e: tir.PrimExpr = A.load(i)
    for _ in range(40):
        e = tir.call("tanh", e * e + e)  # one node read three times: a 3**40-node tree unfolded
    mod = kiln.build(tir.PrimFunc("dag", [A, B], tir.for_range(i, 8, tir.BufferStore(B, e, [i]))))
    assert mod.get_source("tir").count("tanh(") == 40
    a, b = rand()[0], np.zeros(8, "float32")
    mod(a, b)
    want = a.astype(np.float64)
    for _ in range(40):
        want = np.tanh(want * want + want)
    np.testing.assert_allclose(b, want, rtol=1e-5, atol=1e-6)


def test_the_bounds_check_reads_let_bound_values() -> None:
    # shared values are let-bound now: a load moved into a let must still be checked
    A, B = tir.buffer("A", (8,)), tir.buffer("B", (8,))
    i, v = tir.Var("i"), tir.Var("v", "float32")
    body = tir.LetStmt(v, A.load(i + 1), tir.BufferStore(B, v, [i]))
    func = tir.PrimFunc("shifted", [A, B], tir.for_range(i, 8, body))
    with pytest.raises(OutOfBoundsError, match=r"shifted: a read of buffer A at axis 0 reaches indices \[1, 8\]"):
        kiln.build(func)


def test_bind_shared_keeps_a_tree_and_cuts_a_tall_expression() -> None:
    A, B = tir.buffer("A", (8,)), tir.buffer("B", (8,))
    i = tir.Var("i")
    e: tir.PrimExpr = A.load(i)
    for _ in range(200):
        e = tir.call("tanh", e)
    func = tir.PrimFunc("tall", [A, B], tir.for_range(i, 8, tir.BufferStore(B, e, [i])))
    bound = tir.share.bind_shared(func.body)
    lets = str(bound).count(" = tanh(") - 1
    assert 200 // tir.share.MAX_HEIGHT <= lets <= 200 // tir.share.MAX_HEIGHT + 1
    simple = tir.PrimFunc("tree", [A, B], tir.for_range(i, 8, tir.BufferStore(B, A.load(i) * 2.0, [i])))
    assert tir.share.bind_shared(simple.body) is simple.body
    a, b = rand()[0], np.zeros(8, "float32")
    kiln.build(func)(a, b)
    want = a.astype(np.float64)
    for _ in range(200):
        want = np.tanh(want)
    np.testing.assert_allclose(b, want, rtol=1e-5, atol=1e-6)


def test_fusing_past_the_default_group_size_still_builds_one_kernel() -> None:
    x = x_var()
    y: relay.Expr = x
    for _ in range(300):
        y = relay.multiply(relay.add(y, y), relay.const(0.5, "float32"))  # y read twice: 300 lets
    func = relay.Function([x], y)
    with PassContext(config={"relay.FuseOps.max_depth": 600}):
        lib = relay.build(func)
    assert len(lib.kernels) == 1
    data = rand()
    np.testing.assert_allclose(lib.create_executor()(x=data), data, rtol=1e-6)
