"""relay.build, the graph executor, memory planning, and the exported library format."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from kiln import relay, runtime
from kiln.ir.transform import PassContext
from kiln.registry import NoImplementationError, Op, register_implementation
from kiln.relay.backend.build_module import BuildError, build
from kiln.relay.backend.strategy import select_implementation
from kiln.relay.visitor import post_order

RNG = np.random.default_rng(0)


def mlp(batch: int = 4) -> tuple[relay.Function, dict[str, np.ndarray]]:
    x = relay.var("x", shape=(batch, 32))
    w1, b1 = relay.var("w1", shape=(16, 32)), relay.var("b1", shape=(16,))
    w2, b2 = relay.var("w2", shape=(8, 16)), relay.var("b2", shape=(8,))
    h = relay.nn.relu(relay.nn.bias_add(relay.nn.dense(x, w1), b1))
    out = relay.nn.bias_add(relay.nn.dense(h, w2), b2)
    params = {n: RNG.standard_normal(s).astype("float32") * 0.3
              for n, s in [("w1", (16, 32)), ("b1", (16,)), ("w2", (8, 16)), ("b2", (8,))]}
    return relay.Function([x, w1, b1, w2, b2], out), params


def mlp_numpy(x: np.ndarray, p: dict[str, np.ndarray]) -> np.ndarray:
    h = np.maximum(x @ p["w1"].T + p["b1"], 0)
    return h @ p["w2"].T + p["b2"]


def test_mlp_builds_and_matches_numpy() -> None:
    func, params = mlp()
    lib = build(func, params=params)
    ex = lib.create_executor()
    x = RNG.standard_normal((4, 32)).astype("float32")
    np.testing.assert_allclose(ex(x=x), mlp_numpy(x, params), rtol=1e-4, atol=1e-5)
    ex.set_input("x", x)
    ex.run()
    np.testing.assert_allclose(ex.get_output(0), mlp_numpy(x, params), rtol=1e-4, atol=1e-5)
    assert ex.input_names == ["x"] and ex.num_outputs == 1


def test_a_library_says_what_it_holds() -> None:
    x = relay.var("x", shape=(2, 300))
    lib = build(relay.Function([x], relay.Tuple([relay.exp(relay.exp(x)), relay.sum(relay.exp(x), axis=1)])),
                target="llvm -mcpu=znver4")
    assert repr(lib) == (f"<kiln.Library for llvm -mcpu=znver4: {len(lib.kernels)} kernels, 3 launches, "
                         f"{lib.planned_bytes / 1024:.1f} KiB of buffers planned; inputs x: float32[2, 300]; "
                         "outputs output_0: float32[2, 300], output_1: float32[2]>")
    n = relay.var("x", shape=("n", 8))
    lib = build(relay.Function([n], relay.exp(n)), specialize={"n": [1, 4]})
    assert repr(lib).endswith(": 3 kernels, 1 launches, memory planned per size, 2 specialized variant(s); "
                              "inputs x: float32[n, 8]; outputs output_0: float32[n, 8]>")


def test_outputs_of_a_run_are_not_overwritten_by_the_next() -> None:
    func, params = mlp()
    ex = build(func, params=params).create_executor()
    x1, x2 = (RNG.standard_normal((4, 32)).astype("float32") for _ in range(2))
    y1 = ex(x=x1)
    keep = y1.copy()
    ex(x=x2)
    np.testing.assert_array_equal(y1, keep)


def test_later_runs_take_the_native_fast_path_and_stay_right() -> None:
    func, params = mlp()
    ex = build(func, params=params).create_executor()
    assert ex._entries is None  # the first run checks every launch
    for _ in range(3):
        x = RNG.standard_normal((4, 32)).astype("float32")
        np.testing.assert_allclose(ex(x=x), mlp_numpy(x, params), rtol=1e-4, atol=1e-5)
        assert ex._entries is not None
    strided = RNG.standard_normal((4, 64)).astype("float32")[:, ::2]  # copied to a contiguous array
    np.testing.assert_allclose(ex(x=strided), mlp_numpy(strided, params), rtol=1e-4, atol=1e-5)
    with pytest.raises(runtime.ExecutorError, match="expected shape"):
        ex(x=np.zeros((5, 32), np.float32))


def test_the_same_array_for_two_inputs_and_a_value_used_twice() -> None:
    x, y = relay.var("x", shape=(8,)), relay.var("y", shape=(8,))
    ex = build(relay.Function([x, y], relay.add(relay.multiply(x, y), relay.multiply(x, x)))).create_executor()
    a = RNG.standard_normal(8).astype("float32")
    for _ in range(2):  # the checked run, then the fast path
        np.testing.assert_allclose(ex(x=a, y=a), 2 * a * a, rtol=1e-6)
        r = a[::-1]
        # r*a + r*r may round once (a fused multiply-add) where numpy rounds twice: near 0 that is ~1e-9
        np.testing.assert_allclose(ex(x=r, y=a), r * a + r * r, rtol=1e-6, atol=1e-6)


def test_memory_plan_reuses_buffers_of_dead_intermediates() -> None:
    x = relay.var("x", shape=(256, 256))
    y = x
    for _ in range(6):
        y = relay.nn.relu(relay.add(y, x))
    with PassContext(disabled_pass=["FuseOps"]):
        lib = build(relay.Function([x], y))
    temps = [s for s in lib.graph.slots if s.kind == "temp"]
    assert len(temps) == 11  # 12 launches, the last writes the output
    assert len(lib.graph.storage_sizes) == 2  # a chain needs two buffers, used in turn
    assert lib.planned_bytes == 2 * 256 * 256 * 4
    a = RNG.standard_normal((256, 256)).astype("float32")
    want = a
    for _ in range(6):
        want = np.maximum(want + a, 0)
    np.testing.assert_allclose(lib.create_executor()(a), want, rtol=1e-5)


def test_input_errors_name_the_input_and_what_was_expected() -> None:
    func, params = mlp()
    ex = build(func, params=params).create_executor()
    with pytest.raises(runtime.ExecutorError, match=r"model has no input 'y'; its inputs are \['x'\]"):
        ex.set_input("y", np.zeros((4, 32), np.float32))
    with pytest.raises(runtime.ExecutorError, match=r"input 'x': expected shape \(4, 32\), got \(4, 31\)"):
        ex(x=np.zeros((4, 31), np.float32))
    with pytest.raises(runtime.ExecutorError, match="input 'x': expected dtype float32, got float64"):
        ex(x=np.zeros((4, 32)))
    with pytest.raises(runtime.ExecutorError, match=r"inputs not set: \['x'\]"):
        ex.run()
    with pytest.raises(BuildError, match=r"params \['nope'\] are not parameters of main"):
        build(func, params={"nope": np.zeros(1)})


def test_exported_library_runs_in_a_new_process_without_compiling(tmp_path) -> None:
    func, params = mlp()
    lib = build(func, params=params)
    path = tmp_path / "mlp.kiln"
    lib.export(path)
    x = RNG.standard_normal((4, 32)).astype("float32")
    np.save(tmp_path / "x.npy", x)
    code = textwrap.dedent(f"""
        import numpy as np
        import kiln.codegen.backends
        def no_compiling(*a, **k):
            raise AssertionError("compiled in the loading process")
        kiln.codegen.backends.compile_object = no_compiling
        from kiln import runtime
        lib = runtime.load({str(path)!r})
        np.save({str(tmp_path / "y.npy")!r}, lib.create_executor()(np.load({str(tmp_path / "x.npy")!r})))
    """)
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), mlp_numpy(x, params), rtol=1e-4, atol=1e-5)


def test_corrupt_or_truncated_library_files_are_refused(tmp_path) -> None:
    func, params = mlp()
    path = tmp_path / "lib.kiln"
    build(func, params=params).export(path)
    data = bytearray(path.read_bytes())
    (tmp_path / "short").write_bytes(bytes(data[:-10]))
    with pytest.raises(runtime.LibraryFormatError, match="truncated"):
        runtime.load(tmp_path / "short")
    data[-5] ^= 0xFF
    (tmp_path / "flipped").write_bytes(bytes(data))
    with pytest.raises(runtime.LibraryFormatError, match="checksum mismatch"):
        runtime.load(tmp_path / "flipped")
    (tmp_path / "other").write_bytes(b"not a library at all, but long enough to have a header..........")
    with pytest.raises(runtime.LibraryFormatError, match="not a kiln library"):
        runtime.load(tmp_path / "other")


def test_a_label_forces_an_implementation_and_a_missing_one_is_named() -> None:
    generic = select_implementation("nn.relu", "llvm", ["float32"])
    assert generic.name == "generic"
    calls: list[str] = []

    def counting_compute(attrs, inputs, out_type):
        calls.append("labelled")
        return generic.compute(attrs, inputs, out_type)

    register_implementation("nn.relu", counting_compute, generic.schedule, name="counting", label="counting",
                            priority=-5)
    x = relay.var("x", shape=(8,))
    func = relay.Function([x], relay.nn.relu(x))
    build(func)
    assert calls == []  # lower priority than the generic one: not chosen
    with PassContext(config={"relay.backend.use_label": {"nn.relu": "counting"}}):
        lib = build(func)
    assert calls == ["labelled"]
    np.testing.assert_array_equal(lib.create_executor()(np.array([-1, 2] * 4, np.float32)), [0, 2] * 4)
    with PassContext(config={"relay.backend.use_label": {"nn.relu": "nope"}}), pytest.raises(
        NoImplementationError, match=r"op 'nn.relu' has no implementation for target 'llvm', input dtypes "
                                     r"\['float32'\], label 'nope'; registered: generic \(target llvm"):
        build(func)


def _ops_after_optimize(func: relay.Function, params: dict[str, np.ndarray]) -> list[str]:
    """The ops inside the primitive functions of `func` as relay.build compiles it."""
    main = relay.optimize(func, params)["main"]
    groups = [f for f in post_order(main) if isinstance(f, relay.Function) and f is not main]
    return sorted(c.op.name for f in groups for c in post_order(f.body) if isinstance(c, relay.Call)
                  and isinstance(c.op, Op))


def test_build_folds_batch_norm_scale_into_conv_weights_by_default() -> None:
    from kiln.testing import models

    func, params = models.cnn(size=16)
    # outside any PassContext relay.build runs at opt level 3: FoldScaleAxis folds batch_norm's scale
    assert "multiply" not in _ops_after_optimize(func, params)
    with PassContext(opt_level=2):  # a context the user entered is respected
        assert "multiply" in _ops_after_optimize(func, params)
    x = RNG.standard_normal((1, 3, 16, 16)).astype("float32")
    got = relay.build(func, params=params).create_executor()(x=x)
    np.testing.assert_allclose(got, models.cnn_numpy(x, params), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("dtype", "value"), [("float32", 0.1), ("float32", np.inf), ("float64", -2.5e-300),
                                              ("int64", 2**40 + 3), ("int8", -128), ("bool", True)])
def test_one_element_constants_become_immediates_not_kernel_arguments(dtype, value) -> None:
    x = relay.var("x", shape=(5,), dtype=dtype)
    c = relay.const(np.array([value], dtype=dtype))
    op = relay.logical_or if dtype == "bool" else relay.maximum
    lib = build(relay.Function([x], op(x, c)))
    (kernel,) = lib.kernels
    assert len(kernel.func.params) == 2  # x and the output only
    xv = np.array([0, 1, 0, 1, 0], dtype=dtype) if dtype == "bool" else np.arange(5).astype(dtype) - 2
    np.testing.assert_array_equal(lib.create_executor()(x=xv), np.logical_or(xv, value) if dtype == "bool"
                                  else np.maximum(xv, np.array(value, dtype)))


@pytest.mark.parametrize("target", ["llvm", "cuda -arch=sm_80"])
def test_calls_with_empty_results_compile_to_no_kernel(target: str) -> None:
    x = relay.var("x", shape=(3, 4))
    empty = relay.exp(relay.strided_slice(x, begin=(0, 2), end=(3, 2)))
    lib = build(relay.Function([x], relay.Tuple([empty, relay.add(x, x)])), target=target)
    assert len(lib.graph.launches) == 1 and len(lib.kernels) == 1
    if target == "llvm":
        a = RNG.standard_normal((3, 4)).astype("float32")
        got_empty, got_sum = lib.create_executor()(x=a)
        assert got_empty.shape == (3, 0) and got_empty.dtype == np.float32
        np.testing.assert_array_equal(got_sum, a + a)


def test_a_constant_read_by_a_fused_call_and_returned_by_main_is_an_output() -> None:
    # the Constant node sits inside the fused function of add and in main's output tuple: relay.build
    # used to skip every node it found in a fused body, main's own included (KeyError)
    x = relay.var("x", shape=(2,))
    c = relay.const(np.array([0.5, 2.0], "float32"))
    got = build(relay.Function([x], relay.Tuple([relay.add(x, c), c]))).create_executor()(x=np.ones(2, "float32"))
    np.testing.assert_array_equal(got[0], [1.5, 3.0])
    np.testing.assert_array_equal(got[1], [0.5, 2.0])


def test_an_implementation_registered_after_a_build_is_used_by_the_next_build() -> None:
    # the in-memory kernel cache was keyed by the function and target only: the second build got the
    # kernel compiled before the registration (DESIGN: caches are keyed by what lowering read)
    from kiln import te
    from kiln.registry import OpPattern
    from kiln.relay.op._reg import elementwise_compute
    from kiln.relay.op._schedule import default_schedule

    x = relay.var("x", shape=(4,))
    func = relay.Function([x], relay.exp(x))
    data = np.array([0.25, -1.0, 2.0, 0.0], "float32")
    np.testing.assert_allclose(build(func).create_executor()(x=data), np.exp(data), rtol=1e-6)
    doubled = elementwise_compute(lambda attrs, v: te.exp(v) * te.const(2.0, v.dtype), "exp")
    register_implementation("exp", doubled, default_schedule(OpPattern.ELEMWISE), name="doubled", priority=100)
    np.testing.assert_allclose(build(func).create_executor()(x=data), 2 * np.exp(data), rtol=1e-6)


# -- let bindings in main ----------------------------------------------------------------------


def test_a_let_in_main_builds_and_matches_numpy() -> None:
    # relay.build saw the let-bound var as a free variable ("free variable 'v' in main")
    x, v = relay.var("x", shape=(3, 4)), relay.var("v", shape=(3, 4))
    func = relay.Function([x], relay.Let(v, relay.add(x, relay.const(1.0)), relay.multiply(v, v)))
    data = RNG.standard_normal((3, 4)).astype("float32")
    for level in (0, 3):  # each op its own kernel, and fused
        with PassContext(opt_level=level):
            lib = build(func)
        np.testing.assert_allclose(lib.create_executor()(x=data), (data + 1) ** 2, rtol=1e-6)
    assert sum(1 for n in post_order(func) if isinstance(n, relay.Call)) == 2  # the value is computed once


def test_nested_lets_of_tuples_with_a_let_var_as_an_output() -> None:
    x = relay.var("x", shape=(2, 5))
    t, a, b = relay.var("t"), relay.var("a", shape=(2, 5)), relay.var("b", shape=(2, 5))
    pair = relay.Tuple([relay.add(x, relay.const(1.0)), relay.negative(x)])
    body = relay.Let(t, pair, relay.Let(a, relay.TupleGetItem(t, 0),
                     relay.Let(b, relay.multiply(a, relay.TupleGetItem(t, 1)), relay.Tuple([b, a]))))
    data = RNG.standard_normal((2, 5)).astype("float32")
    got = build(relay.Function([x], body)).create_executor()(x=data)
    np.testing.assert_allclose(got[0], (data + 1) * -data, rtol=1e-6)
    np.testing.assert_allclose(got[1], data + 1, rtol=1e-6)


def test_a_chain_of_2000_lets_builds_without_recursion() -> None:
    x = relay.var("x", shape=(4,))
    lets = [relay.var(f"v{i}", shape=(4,)) for i in range(2_000)]
    body: relay.Expr = lets[-1]
    for i in reversed(range(len(lets))):
        body = relay.Let(lets[i], relay.add(x if i == 0 else lets[i - 1], relay.const(0.5)), body)
    data = RNG.standard_normal(4).astype("float32")
    want = data.copy()
    for _ in lets:
        want = want + np.float32(0.5)
    np.testing.assert_allclose(build(relay.Function([x], body)).create_executor()(x=data), want, rtol=1e-6)


def test_the_walk_to_kernel_values_flattens_tuples_and_names_what_it_cannot_lower() -> None:
    from kiln.relay.backend.te_compiler import flat_values

    x, y = relay.var("x", shape=(2,)), relay.var("y", shape=(3,))
    pair = relay.Tuple([relay.exp(x), relay.Tuple([x, y])])
    func = relay.infer_type(relay.Function([x, y], relay.Tuple([relay.TupleGetItem(pair, 1), pair])))
    names = {id(x): ["x"], id(y): ["y"]}
    body = flat_values(func, lambda p: names[id(p)], lambda c: ["c"], lambda call, ins: [f"exp({ins[0]})"],
                       BuildError, "main")
    assert body == ["x", "y", "exp(x)", "x", "y"]
    v = relay.var("v", shape=(2,))
    with pytest.raises(BuildError, match="free variable 'v' in main"):
        flat_values(relay.Function([x], relay.add(x, v)), lambda p: [0], lambda c: [1], lambda n, a: [2],
                    BuildError, "main")
    cond = relay.var("c", shape=(), dtype="bool")
    with pytest.raises(BuildError, match="cannot lower a If in main"):
        flat_values(relay.Function([cond, x], relay.If(cond, x, x)), lambda p: [0], lambda c: [1],
                    lambda n, a: [2], BuildError, "main")


def test_kernels_compile_ahead_on_threads_and_a_failure_is_reported_by_the_walk() -> None:
    import threading

    threads: list[str] = []
    generic = select_implementation("nn.relu", "llvm", ["float32"])

    def recording(attrs, inputs, out_type):
        threads.append(threading.current_thread().name)
        return generic.compute(attrs, inputs, out_type)

    def failing(attrs, inputs, out_type):
        raise ValueError("this compute is broken")

    register_implementation("nn.relu", recording, generic.schedule, name="recording", label="recording")
    register_implementation("nn.relu", failing, generic.schedule, name="failing", label="failing")
    x = relay.var("x", shape=(4, 8))
    y = relay.nn.relu(x)
    for width in (3, 5, 7):  # three distinct kernels (different shapes), joined by an opaque softmax
        y = relay.nn.relu(relay.nn.softmax(relay.nn.dense(y, relay.const(np.ones((width, 8), np.float32)))))
        y = relay.nn.dense(y, relay.const(np.ones((8, width), np.float32)))
    func = relay.Function([x], y)
    seen: list[tuple[int, int]] = []
    with PassContext(config={"relay.backend.use_label": {"nn.relu": "recording"}}):
        lib = build(func, progress=lambda done, total: seen.append((done, total)))
    assert threads and all(name.startswith("kiln-compile") for name in threads)
    total = seen[-1][1]
    assert seen == [(k, total) for k in range(1, total + 1)]  # each kernel once, in order of completion
    assert lib.create_executor()(np.ones((4, 8), np.float32)).shape == (4, 8)
    with PassContext(config={"relay.backend.use_label": {"nn.relu": "failing"}}), \
            pytest.raises(ValueError, match="this compute is broken"):
        build(func)


def test_groups_differing_only_in_weights_share_one_compiled_kernel() -> None:
    x = relay.var("x", shape=(1, 8, 9, 9))
    weights = [RNG.standard_normal((8, 8, 3, 3)).astype("float32") * 0.2 for _ in range(3)]
    h = x
    for w in weights:
        h = relay.nn.relu(relay.nn.conv2d(h, relay.const(w), padding=(1, 1)))
    lib = build(relay.Function([x], h))
    assert len(lib.kernels) == 1 and len(lib.graph.launches) == 3

    data = RNG.standard_normal((1, 8, 9, 9)).astype("float32")
    want = data
    for w in weights:
        padded = np.pad(want, ((0, 0), (0, 0), (1, 1), (1, 1)))
        windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3))
        want = np.maximum(np.einsum("ncyxij,ocij->noyx", windows, w), 0)
    np.testing.assert_allclose(lib.create_executor()(x=data), want, rtol=1e-4, atol=1e-4)


def test_a_build_under_instruments_runs_its_passes_even_when_the_library_is_cached() -> None:
    import io

    from kiln.ir.transform import PrintIRInstrument

    x = relay.var("x", shape=(3, 5))
    func = relay.Function([x], relay.exp(relay.negative(x)))
    build(func)  # the library cache now holds it
    for _ in range(2):
        seen = io.StringIO()
        with PassContext(opt_level=3, instruments=[PrintIRInstrument(stream=seen)]):
            build(func)
        assert "// IR after FuseOps" in seen.getvalue()


def test_with_caches_off_a_second_build_compiles_its_kernels_again(monkeypatch: pytest.MonkeyPatch) -> None:
    from kiln.relay.backend import te_compiler

    lowered: list[str] = []
    real = te_compiler.optimize_tir
    monkeypatch.setattr(te_compiler, "optimize_tir", lambda f: (lowered.append(f.name), real(f))[1])
    x = relay.var("x", shape=(3, 7))
    func = relay.Function([x], relay.nn.relu(relay.add(x, relay.const(1.0))))
    monkeypatch.setenv("KILN_CACHE", "0")
    relay.build(func)
    first = len(lowered)
    relay.build(func)
    assert first > 0 and len(lowered) == 2 * first  # KILN_CACHE=0: every build lowers every kernel again
