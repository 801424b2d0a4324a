"""The ONNX indexing ops of kiln/relay/op/indexing.py (gather_elements, gather_nd, scatter_elements,
scatter_nd, topk): numpy references checked against plain numpy loops, each op compiled through its
compute and schedule and compared with its reference, and the relations' errors."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
from op_helpers import build_op, check_build, ref, rel, rel_error

from kiln.ir.types import TensorType, TupleType
from kiln.relay.op import algorithm, indexing

I = indexing  # noqa: E741

Array = np.ndarray[Any, Any]
RNG = np.random.default_rng(7)


def tt(shape: tuple[int, ...], dtype: str = "float32") -> TensorType:
    return TensorType(shape, dtype)


def values(shape: tuple[int, ...], dtype: str = "float32") -> Array:
    """Distinct values (so a misplaced element always shows), shuffled."""
    v = RNG.permutation(int(np.prod(shape))).reshape(shape) - 5
    return np.asarray(v * (1.5 if dtype.startswith("float") else 1), dtype=dtype)


def indices(shape: tuple[int, ...], size: int, dtype: str = "int64") -> Array:
    """Indices in [-size, size): negative ones count from the end."""
    return RNG.integers(-size, size, shape).astype(dtype)


# --- gather_elements ---------------------------------------------------------------------------


def gather_elements_loop(x: Array, idx: Array, axis: int) -> Array:
    out = np.empty(idx.shape, x.dtype)
    for i in np.ndindex(idx.shape):
        j = list(i)
        j[axis] = int(idx[i]) % x.shape[axis]
        out[i] = x[tuple(j)]
    return out


@pytest.mark.parametrize(
    ("shape", "ishape", "axis", "dtype"),
    [((3, 4), (3, 4), 0, "float32"), ((3, 4), (2, 7), 1, "int32"), ((2, 3, 5), (2, 1, 4), -1, "float32"),
     ((7,), (11,), 0, "int64"), ((2, 5, 3), (2, 6, 3), 1, "float16")],
)
def test_gather_elements_matches_a_loop_and_compiles(shape: tuple[int, ...], ishape: tuple[int, ...], axis: int,
                                                     dtype: str) -> None:
    x, idx = values(shape, dtype), indices(ishape, shape[axis], "int32" if dtype == "int32" else "int64")
    np.testing.assert_array_equal(ref("gather_elements", x, idx, axis=axis), gather_elements_loop(x, idx, axis))
    check_build("gather_elements", x, idx, axis=axis)


def test_gather_elements_relation_errors() -> None:
    with rel_error("integer indices", arg=1):
        rel("gather_elements", [tt((2, 3)), tt((2, 3))])
    with rel_error("rank 1 but data has rank 2", arg=1):
        rel("gather_elements", [tt((2, 3)), tt((3,), "int64")])
    with rel_error("dim 0 is larger", arg=1):
        rel("gather_elements", [tt((2, 3)), tt((3, 3), "int64")], axis=1)
    with rel_error("axis", arg=None):
        rel("gather_elements", [tt((2, 3)), tt((2, 3), "int64")], axis=2)


# --- gather_nd -----------------------------------------------------------------------------------


def gather_nd_loop(x: Array, idx: Array, b: int) -> Array:
    depth = idx.shape[-1]
    out = np.empty((*idx.shape[:-1], *x.shape[b + depth :]), x.dtype)
    for i in np.ndindex(idx.shape[:-1]):
        picked = tuple(int(v) % x.shape[b + j] for j, v in enumerate(idx[i]))
        out[i] = x[(*i[:b], *picked)]
    return out


@pytest.mark.parametrize(
    ("shape", "ishape", "b"),
    [((2, 2), (2, 2), 0), ((2, 2), (2, 1), 0), ((2, 2, 2), (2, 1, 2), 0), ((2, 2, 2), (2, 1), 1),
     ((3, 4, 5), (3, 2, 2), 1), ((5, 6), (2,), 0), ((5, 6), (1,), 0), ((2, 3, 4), (2, 3, 1), 2)],
)
def test_gather_nd_matches_a_loop_and_compiles(shape: tuple[int, ...], ishape: tuple[int, ...], b: int) -> None:
    x = values(shape)
    idx = np.stack([indices(ishape[:-1], shape[b + j]) for j in range(ishape[-1])], axis=-1)
    np.testing.assert_array_equal(ref("gather_nd", x, idx, batch_dims=b), gather_nd_loop(x, idx, b))
    check_build("gather_nd", x, idx, batch_dims=b)


def test_gather_nd_relation_errors() -> None:
    assert rel("gather_nd", [tt((3, 4, 5)), tt((3, 7, 2), "int32")], batch_dims=1) == tt((3, 7))
    with rel_error("batch_dims 2 must be less", arg=1):
        rel("gather_nd", [tt((3, 4)), tt((3, 1), "int64")], batch_dims=2)
    with rel_error("batch dims of data", arg=1):
        rel("gather_nd", [tt((3, 4)), tt((2, 1), "int64")], batch_dims=1)
    with rel_error("last dim of indices .* is 3; data of rank 2 with batch_dims 0 allows 1 to 2", arg=1):
        rel("gather_nd", [tt((3, 4)), tt((2, 3), "int64")])


# --- scatter_elements, scatter_nd ------------------------------------------------------------------

COMBINE = {"none": lambda a, b: b, "add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def scatter_elements_loop(x: Array, idx: Array, upd: Array, axis: int, reduction: str) -> Array:
    out = x.copy()
    for i in np.ndindex(idx.shape):
        j = list(i)
        j[axis] = int(idx[i]) % x.shape[axis]
        out[tuple(j)] = COMBINE[reduction](out[tuple(j)], upd[i])
    return out


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize(("shape", "ishape", "axis"), [((3, 5), (2, 5), 0), ((4, 6, 3), (3, 4, 2), 1)])
def test_scatter_elements_matches_a_loop_and_compiles(shape: tuple[int, ...], ishape: tuple[int, ...], axis: int,
                                                      reduction: str) -> None:
    x, upd = values(shape), values(ishape)
    # distinct targets for "none" (ONNX leaves duplicates undefined there); duplicates for the reductions
    n = shape[axis]
    if reduction == "none":
        idx = np.argsort(RNG.random((*ishape[:axis], n, *ishape[axis + 1 :])), axis=axis)
        idx = np.take(idx, range(ishape[axis]), axis=axis) - n * (RNG.random(ishape) < 0.5)
    else:
        idx = indices(ishape, n)
    want = scatter_elements_loop(x, idx, upd, axis, reduction)
    np.testing.assert_array_equal(ref("scatter_elements", x, idx, upd, axis=axis, reduction=reduction), want)
    np.testing.assert_allclose(build_op("scatter_elements", x, idx, upd, axis=axis, reduction=reduction)[0], want,
                               rtol=1e-6)


def test_scatter_elements_duplicates_without_reduction_take_the_last_update() -> None:
    x, idx, upd = np.zeros(4, "float32"), np.array([1, 1, -3, 2]), np.array([1, 2, 3, 4], "float32")
    got = build_op("scatter_elements", x, idx, upd)[0]
    np.testing.assert_array_equal(got, [0, 3, 4, 0])
    np.testing.assert_array_equal(ref("scatter_elements", x, idx, upd), got)


def scatter_nd_loop(x: Array, idx: Array, upd: Array, reduction: str) -> Array:
    out = x.copy()
    for i in np.ndindex(idx.shape[:-1]):
        at = tuple(int(v) % x.shape[j] for j, v in enumerate(idx[i]))
        out[at] = COMBINE[reduction](out[at], upd[i])
    return out


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize(("shape", "ishape"), [((4, 4, 4), (2, 1)), ((5, 3), (2, 2, 2)), ((8,), (4, 1))])
def test_scatter_nd_matches_a_loop_and_compiles(shape: tuple[int, ...], ishape: tuple[int, ...],
                                                reduction: str) -> None:
    depth = ishape[-1]
    lead = int(np.prod(ishape[:-1]))
    if reduction == "none":  # distinct index tuples
        tuples = list(itertools.product(*(range(d) for d in shape[:depth])))
        picked = [tuples[k] for k in RNG.permutation(len(tuples))[:lead]]
        idx = np.array(picked, dtype=np.int64).reshape(ishape) - np.array(shape[:depth]) * (RNG.random(ishape) < .5)
    else:
        idx = np.stack([indices(ishape[:-1], shape[j]) for j in range(depth)], axis=-1)
    x, upd = values(shape), values((*ishape[:-1], *shape[depth:]))
    want = scatter_nd_loop(x, idx, upd, reduction)
    np.testing.assert_array_equal(ref("scatter_nd", x, idx, upd, reduction=reduction), want)
    np.testing.assert_allclose(build_op("scatter_nd", x, idx, upd, reduction=reduction)[0], want, rtol=1e-6)


def test_scatter_relation_errors() -> None:
    with rel_error("updates have dtype int32 but data has float32", arg=2):
        rel("scatter_elements", [tt((3,)), tt((2,), "int64"), tt((2,), "int32")])
    with rel_error("updates have shape \\(3,\\); expected \\(2,\\)", arg=2):
        rel("scatter_elements", [tt((3,)), tt((2,), "int64"), tt((3,))])
    with rel_error("updates have shape \\(2, 3\\); expected \\(2, 4\\)", arg=2):
        rel("scatter_nd", [tt((5, 4)), tt((2, 1), "int64"), tt((2, 3))])
    with rel_error("must be static", arg=1):
        from kiln.ir.types import SizeVar
        rel("scatter_nd", [tt((5, 4)), TensorType((2, SizeVar("n")), "int64"), tt((2, 3))])
    with pytest.raises(Exception, match="reduction"):
        I.scatter_nd(None, None, None, reduction="sum")  # type: ignore[arg-type]


# --- topk ---------------------------------------------------------------------------------------------


def topk_numpy(x: Array, k: int, axis: int, largest: bool) -> tuple[Array, Array]:
    """Stable sort: equal values keep their order, so ties go to the lower index."""
    order = np.argsort(-x if largest else x, axis=axis, kind="stable")
    index = np.take(order, range(k), axis=axis)
    return np.take_along_axis(x, index, axis=axis), index.astype(np.int64)


@pytest.mark.parametrize(
    ("shape", "k", "axis", "largest", "dtype"),
    [((3, 4), 3, -1, True, "float32"), ((3, 4), 2, 0, False, "float32"), ((2, 9, 3), 4, 1, True, "int32"),
     ((17,), 17, 0, False, "int64"), ((5, 6), 0, 1, True, "float32")],
)
def test_topk_matches_a_stable_sort_and_compiles(shape: tuple[int, ...], k: int, axis: int, largest: bool,
                                                 dtype: str) -> None:
    x = (RNG.integers(0, 4, shape)).astype(dtype)  # many ties
    want = topk_numpy(x, k, axis, largest)
    for got in (ref("topk", x, k=k, axis=axis, largest=largest), build_op("topk", x, k=k, axis=axis, largest=largest)):
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])
        assert got[1].dtype == np.int64


def test_topk_puts_nan_first_among_the_largest_and_last_among_the_smallest() -> None:
    x = np.array([1.0, np.nan, 3.0, 2.0], "float32")
    big, small = build_op("topk", x, k=2), build_op("topk", x, k=2, largest=False)
    np.testing.assert_array_equal(big[1], [1, 2])
    np.testing.assert_array_equal(small[1], [0, 3])
    np.testing.assert_array_equal(ref("topk", x, k=2)[1], big[1])


def test_topk_relation_and_errors() -> None:
    assert rel("topk", [tt((3, 5))], k=2) == TupleType([tt((3, 2)), tt((3, 2), "int64")])
    with rel_error("k 6 is larger than axis 1"):
        rel("topk", [tt((3, 5))], k=6)
    with rel_error("scalar"):
        rel("topk", [tt(())], k=1)
    with pytest.raises(Exception, match="k"):
        algorithm.topk(None, k=-1)  # type: ignore[arg-type]


# --- text round trip, errors through type inference --------------------------------------------------------


def _calls() -> list[tuple[str, Any]]:
    from kiln import relay

    x, i = relay.var("x", shape=(4, 5), dtype="float32"), relay.var("i", shape=(4, 2), dtype="int64")
    u, t = relay.var("u", shape=(4, 2), dtype="float32"), relay.var("t", shape=(3, 1), dtype="int64")
    v = relay.var("v", shape=(3, 5), dtype="float32")
    return [
        ("gather_elements", relay.Function([x, i], I.gather_elements(x, i, axis=-1))),
        ("gather_nd", relay.Function([x, t], I.gather_nd(x, t))),
        ("scatter_elements", relay.Function([x, i, u], I.scatter_elements(x, i, u, axis=1, reduction="max"))),
        ("scatter_nd", relay.Function([x, t, v], I.scatter_nd(x, t, v, reduction="add"))),
        ("topk", relay.Function([x], algorithm.topk(x, 3, axis=0, largest=False))),
    ]


@pytest.mark.parametrize("index", range(5))
def test_calls_print_and_parse_back(index: int) -> None:
    from kiln.relay import parse
    from kiln.relay.analysis import structural_equal
    from kiln.relay.printer import astext

    _, f = _calls()[index]
    back = parse(astext(f))
    assert astext(back, show_types=False) == astext(f, show_types=False)
    assert structural_equal(back, f, map_free_vars=True)


def test_type_errors_name_the_op_and_the_argument() -> None:
    from kiln import relay
    from kiln.relay.type_infer import TypeInferenceError

    x, i = relay.var("x", shape=(2, 0), dtype="float32"), relay.var("i", shape=(2, 3), dtype="int64")
    with pytest.raises(TypeInferenceError, match="op gather_elements, argument indices .*no elements along axis 1"):
        relay.infer_type(relay.Function([x, i], I.gather_elements(x, i, axis=1)))
    y, j = relay.var("y", shape=(2, 3), dtype="float32"), relay.var("j", shape=(2, 3), dtype="float32")
    with pytest.raises(TypeInferenceError, match="op scatter_elements, argument indices .*integer indices"):
        relay.infer_type(relay.Function([y, j], I.scatter_elements(y, j, y)))


# --- cuda: the generated CUDA C, run on the host stand-in (and on a GPU where there is one) --------------------


def _cuda_cases() -> list[tuple[str, tuple[Array, ...], dict[str, Any]]]:
    x, u = values((3, 5)), values((3, 2))
    i = np.array([[0, -1], [4, 4], [2, 1]], np.int64)
    t = np.array([[2], [-3]], np.int64)
    return [
        ("gather_elements", (x, i), {"axis": 1}),
        ("gather_nd", (x, t), {}),
        ("scatter_elements", (x, i, u), {"axis": 1, "reduction": "add"}),
        ("scatter_nd", (x, t, values((2, 5))), {}),
        ("topk", (np.array([[1, 3, 3, 0, 2], [2, 2, 1, 1, 0], [0, 0, 0, 0, 0]], np.float32),), {"k": 3}),
    ]


@pytest.mark.parametrize("index", range(5))
def test_ops_run_as_cuda_through_the_host_stand_in(index: int, monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Any) -> None:
    import shutil

    import cuda_standin
    from op_helpers import assert_outputs_match, compile_op, reference_outputs, run_on_device

    name, arrays, kw = _cuda_cases()[index]
    want = reference_outputs(name, *arrays, **kw)
    if cuda_standin.HAS_GPU:
        import cupy

        kernel = compile_op(name, *arrays, target="cuda", **kw)
        assert_outputs_match(name, [o.get() for o in run_on_device(kernel, *arrays, xp=cupy)], want)
    kernel = compile_op(name, *arrays, target="cuda -arch=sm_90", **kw)
    if shutil.which("g++") is None:
        pytest.skip("no g++ for the host stand-in")
    cuda_standin.install(monkeypatch, tmp_path)
    outs = run_on_device(kernel, *arrays, xp=cuda_standin.FAKE_CUPY)
    assert_outputs_match(name, [o.get() for o in outs], want)


@pytest.mark.parametrize(("n", "k", "largest", "dtype"), [(8200, 4, True, "float32"), (8300, 3, False, "float32"),
                                                          (8400, 2, True, "int32")])
def test_topk_picking_one_pass_at_a_time_matches_a_stable_sort(n: int, k: int, largest: bool, dtype: str) -> None:
    # rows this long take the passes of _topk_select, not the ranks
    assert n * n > algorithm._RANK_MAX_WORK and k <= algorithm._SELECT_MAX_K
    x = RNG.integers(0, 9, (1, n)).astype(dtype)
    if dtype == "float32":
        x[0, [5, 40]] = np.nan
    want = ref("topk", x, k=k, largest=largest)
    got = build_op("topk", x, k=k, largest=largest)
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[0], want[0])
    if dtype != "float32":
        np.testing.assert_array_equal(got[1], topk_numpy(x, k, -1, largest)[1])


def test_topk_passes_handle_rows_of_nans() -> None:
    x = np.full((1, 8200), np.nan, np.float32)
    x[0, [3, 60]] = 2.0
    for largest in (True, False):
        np.testing.assert_array_equal(build_op("topk", x, k=3, largest=largest)[1], ref("topk", x, k=3,
                                                                                         largest=largest)[1])
