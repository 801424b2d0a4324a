"""A graph of symbolic shapes (`relay.var("x", shape=("n", 8))`): built once, run at any size; the executor reads the
sizes off the inputs, checks that they agree before any kernel runs, plans memory per size and keeps it while the
sizes repeat; kernels whose buffers have products of sizes (`n*s`) get the sizes from it; the library file keeps
the symbolic shapes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kiln import relay, runtime
from kiln.relay.backend import te_compiler
from kiln.relay.backend.build_module import BuildError
from kiln.runtime.library import ExecutorError
from kiln.runtime.module import ArgumentError

RNG = np.random.default_rng(0)


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype("float32")


@pytest.fixture(scope="module")
def chain() -> runtime.Library:
    """exp(relu(x + b) + 1) * 0.5, then reshaped (n, s, 4) -> (n*s, 4) and scaled by a (n, s, 1) mask: two kernels."""
    x, b, m = relay.var("x", shape=("n", "s", 4)), relay.var("b", shape=(4,)), relay.var("m", shape=("n", "s", 1))
    h = relay.exp(relay.add(relay.nn.relu(relay.add(x, b)), relay.const(1.0)))
    h = relay.multiply(relay.multiply(h, m), relay.const(0.5))
    out = relay.reshape(relay.exp(h), (-1, 4))
    return relay.build(relay.Function([x, b, m], relay.Tuple([out, relay.sum(h, axis=2)])))


def reference(x: np.ndarray, b: np.ndarray, m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    h = 0.5 * np.exp(np.maximum(x + b, 0) + 1) * m
    return np.exp(h).reshape(-1, 4), h.sum(axis=2)


def test_one_library_runs_every_size_and_compiles_nothing_more(chain: runtime.Library,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    assert chain.graph.symbols == ("n", "s")
    kernels = len(chain.kernels)
    monkeypatch.setattr(te_compiler, "compile_primitive", lambda *a, **k: pytest.fail("compiled at run time"))
    ex = chain.create_executor()
    b = rand(4)
    for n, s in [(1, 1), (3, 17), (8, 128), (3, 17), (2, 384)]:
        x, m = rand(n, s, 4), rand(n, s, 1)
        got = ex(x=x, b=b, m=m)
        for g, w in zip(got, reference(x, b, m), strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-5)
    assert len(chain.kernels) == kernels


def test_a_profile_of_a_symbolic_library_reports_the_graph_of_its_sizes(chain: runtime.Library) -> None:
    ex = chain.create_executor()
    b = rand(4)
    for n, s in [(2, 3), (5, 7)]:
        profile = ex.profile(repeat=2, x=rand(n, s, 4), b=b, m=rand(n, s, 1))
        assert len(profile.launches) == len(chain.graph.launches)
        assert f"float32[{n * s}, 4]" in profile.table()


def test_a_change_of_sizes_copies_no_constant_again() -> None:
    """A weight is copied for the kernels once per executor, not once per size (BERT's word embeddings are
    94 MB)."""
    x = relay.var("x", shape=("n", 64))
    lib = relay.build(relay.Function([x], relay.nn.dense(x, relay.const(rand(32, 64)))))
    ex = lib.create_executor()
    seen = []
    for n in (2, 3, 2):
        ex(x=rand(n, 64))
        seen.append([ex._values[s] for s in sorted(ex._graph.constants)])  # (held: no id is reused)
    assert seen[0] and all(a is b is c for a, b, c in zip(*seen, strict=True))


def test_memory_is_planned_per_size_and_kept_while_the_sizes_repeat(chain: runtime.Library) -> None:
    ex = chain.create_executor()
    b = rand(4)
    ex(x=rand(2, 3, 4), b=b, m=rand(2, 3, 1))
    planned, buffers = ex.planned_bytes, ex._buffers
    ex(x=rand(2, 3, 4), b=b, m=rand(2, 3, 1))
    assert ex._buffers is buffers  # the same sizes: the same buffers, and the fast path bound to them
    ex(x=rand(4, 3, 4), b=b, m=rand(4, 3, 1))
    assert ex.planned_bytes == 2 * planned


@pytest.mark.parametrize(("x", "m", "message"), [
    ((2, 3, 4), (2, 4, 1), r"size s is 3 from input x\.shape\[1\] but 4 from input m\.shape\[1\]"),
    ((2, 3, 4), (3, 3, 1), r"size n is 2 from input x\.shape\[0\] but 3 from input m\.shape\[0\]"),
    ((2, 3, 5), (2, 3, 1), r"input 'x': expected shape \('n', 's', 4\), got \(2, 3, 5\)"),
    ((2, 3), (2, 3, 1), r"input 'x': expected shape \('n', 's', 4\), got \(2, 3\)"),
])
def test_inputs_that_disagree_are_refused_naming_both_and_the_size(chain: runtime.Library, x: tuple[int, ...],
                                                                   m: tuple[int, ...], message: str) -> None:
    ex = chain.create_executor()
    with pytest.raises(ExecutorError, match=message):
        ex(x=rand(*x), b=rand(4), m=rand(*m))


def test_a_dim_that_is_a_multiple_of_a_size_gives_it_or_is_checked_against_it() -> None:
    x, y = relay.var("x", shape=("2*n", 3)), relay.var("y", shape=("n", 3))
    ex = relay.build(relay.Function([x, y], relay.add(relay.reshape(x, (-1, 2, 3)), relay.expand_dims(y, 1)))
                     ).create_executor()
    got = ex(x=np.ones((4, 3), "float32"), y=np.zeros((2, 3), "float32"))
    assert got.shape == (2, 2, 3)
    with pytest.raises(ExecutorError, match=r"input x\.shape\[0\] is 6, but its dim 2\*n is 4 with n = 2"):
        ex(x=np.ones((6, 3), "float32"), y=np.zeros((2, 3), "float32"))
    lone = relay.var("z", shape=("2*m", 3))
    only_product = relay.build(relay.Function([lone], relay.exp(lone))).create_executor()
    np.testing.assert_allclose(only_product(z=np.zeros((6, 3), "float32")), np.ones((6, 3)))
    with pytest.raises(ExecutorError, match=r"input z\.shape\[0\] is 5, but its dim 2\*m is a multiple of 2"):
        only_product(z=np.zeros((5, 3), "float32"))


def test_a_kernel_of_a_product_of_sizes_takes_them_by_name() -> None:
    x = relay.var("x", shape=("n", "s", 4))
    lib = relay.build(relay.Function([x], relay.exp(relay.reshape(x, (-1, 4)))))
    (kernel,) = lib.kernels
    a, out = rand(2, 3, 4), np.zeros((6, 4), "float32")
    kernel(a, out)  # n and s come from a's shape
    np.testing.assert_allclose(out, np.exp(a.reshape(6, 4)), rtol=1e-6)
    flat = relay.var("f", shape=("n*s", 4))
    (alone,) = relay.build(relay.Function([flat], relay.exp(flat))).kernels
    with pytest.raises(ArgumentError, match=r"n\*s = 6, which does not give the sizes n, s: pass them"):
        alone(a.reshape(6, 4), out)
    alone(a.reshape(6, 4), out, sizes={"n": 2, "s": 3})
    with pytest.raises(ArgumentError, match=r"should be 8 with n = 2 .* but the array has 6"):
        alone(a.reshape(6, 4), out, sizes={"n": 2, "s": 4})


def test_the_library_file_keeps_the_symbolic_shapes(chain: runtime.Library, tmp_path: Path) -> None:
    chain.export(tmp_path / "sym.kiln")
    loaded = runtime.load(tmp_path / "sym.kiln")
    assert loaded.graph.symbols == ("n", "s")
    x, b, m = rand(3, 5, 4), rand(4), rand(3, 5, 1)
    for g, w in zip(loaded.create_executor()(x=x, b=b, m=m), reference(x, b, m), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5)


def test_symbolic_dims_are_refused_for_cuda_for_now() -> None:
    x = relay.var("x", shape=("n", 4))
    with pytest.raises(BuildError, match="symbolic dims compile for the CPU only"):
        relay.build(relay.Function([x], relay.exp(x)), target="cuda -arch=sm_80")


def test_specialize_adds_static_fast_paths_that_runs_of_those_sizes_take(tmp_path: Path) -> None:
    x, b = relay.var("x", shape=("n", 8)), relay.var("b", shape=(8,))
    lib = relay.build(relay.Function([x, b], relay.exp(relay.add(x, b))), specialize={"n": [1, 4]})
    assert [(sizes, g.symbols) for sizes, g in lib.variants] == [({"n": 1}, ()), ({"n": 4}, ())]
    lib.export(tmp_path / "spec.kiln")
    for library in (lib, runtime.load(tmp_path / "spec.kiln")):
        ex = library.create_executor()
        for n in (1, 4, 3):
            xv, bv = rand(n, 8), rand(8)
            np.testing.assert_allclose(ex(x=xv, b=bv), np.exp(xv + bv), rtol=1e-6)
            assert (ex._graph is library.variant({"n": n})) == (n != 3)  # 3: the symbolic graph, specialized
    with pytest.raises(BuildError, match=r"specialize: 'm' is not a size variable of main's inputs; they are \['n'\]"):
        relay.build(relay.Function([x, b], relay.exp(x)), specialize={"m": [1]})
    with pytest.raises(BuildError, match=r"the values of 'n' must be sizes"):
        relay.build(relay.Function([x, b], relay.exp(x)), specialize={"n": [-1]})


def test_a_variant_that_fixes_some_sizes_is_specialized_to_the_others_at_run_time() -> None:
    x = relay.var("x", shape=("n", "s", 4))
    lib = relay.build(relay.Function([x], relay.nn.softmax(x)), specialize={"n": [2]})
    ((sizes, variant),) = lib.variants
    assert sizes == {"n": 2} and variant.symbols == ("s",)
    ex = lib.create_executor()
    for n, s in [(2, 3), (2, 5), (1, 3)]:
        xv = rand(n, s, 4)
        e = np.exp(xv - xv.max(-1, keepdims=True))
        np.testing.assert_allclose(ex(x=xv), e / e.sum(-1, keepdims=True), rtol=1e-5)


def test_sums_of_sizes_a_kv_cache_concatenation_and_a_reflect_pad(tmp_path: Path) -> None:
    past, new, q = (relay.var(name, shape=("n", 2, s, 8)) for name, s in (("past", "p"), ("new", "s"), ("q", "s")))
    kv = relay.concatenate([past, new], axis=2)  # (n, 2, p + s, 8)
    attend = relay.nn.matmul(relay.nn.softmax(relay.nn.matmul(q, kv, transpose_b=True), axis=-1), kv)
    func = relay.infer_type(relay.Function([past, new, q], relay.Tuple([attend, kv])))
    assert str(func.checked_type.ret_type.fields[1]) == "Tensor[(n, 2, p + s, 8), float32]"
    relay.build(func).export(tmp_path / "kv.kiln")
    ex = runtime.load(tmp_path / "kv.kiln").create_executor()
    for n, p, s in [(1, 0, 1), (2, 5, 1), (1, 7, 3)]:
        pv, nv, qv = rand(n, 2, p, 8), rand(n, 2, s, 8), rand(n, 2, s, 8)
        k = np.concatenate([pv, nv], 2)
        scores = qv @ k.transpose(0, 1, 3, 2)
        e = np.exp(scores - scores.max(-1, keepdims=True))
        got, got_kv = ex(past=pv, new=nv, q=qv)
        np.testing.assert_array_equal(got_kv, k)
        np.testing.assert_allclose(got, e / e.sum(-1, keepdims=True) @ k, rtol=1e-5, atol=1e-6)
    x = relay.var("x", shape=("n", 4))
    padded = relay.build(relay.Function([x], relay.nn.pad(x, ((1, 2), (0, 0)), pad_mode="reflect"))).create_executor()
    xv = rand(5, 4)
    np.testing.assert_array_equal(padded(x=xv), np.pad(xv, ((1, 2), (0, 0)), mode="reflect"))
    y = relay.var("y", shape=("n + 1", 4))
    with pytest.raises(ExecutorError, match=r"y\.shape\[0\] has the dim n \+ 1 = 5, which does not tell n"):
        relay.build(relay.Function([y], relay.exp(y))).create_executor()(y=xv)
