"""The graph executor (kiln.runtime.executor): input layouts and conversions, threads, empty and huge sizes."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import attrs
import cuda_standin
import numpy as np
import pytest
from cuda_standin import FAKE_CUPY, DLPackOnDevice, HostArray

import kiln
from kiln import relay, runtime, te
from kiln.ir.span import Span, span_scope
from kiln.ir.transform import PassContext
from kiln.relay.backend.build_module import BuildError, build
from kiln.runtime import executor as executor_module
from kiln.runtime.cuda_module import CudaModule
from kiln.runtime.executor import MAX_ELEMENTS, _Device, slot_bytes
from kiln.runtime.library import Library
from kiln.testing import models

RNG = np.random.default_rng(13)


def dense_model(batch: int = 4) -> Library:
    """dense(x, w): the model of the issue's Fortran-order report."""
    x, w = relay.var("x", shape=(batch, 8)), relay.var("w", shape=(3, 8))
    return build(relay.Function([x, w], relay.nn.dense(x, w)))


def mlp_model(hidden: int = 16) -> tuple[Library, Callable[[np.ndarray], np.ndarray]]:
    """Two dense layers with bias and relu (intermediates in planned buffers) and their numpy twin."""
    w1 = RNG.standard_normal((hidden, 8)).astype("float32")
    b1 = RNG.standard_normal(hidden).astype("float32")
    w2 = RNG.standard_normal((4, hidden)).astype("float32")
    x = relay.var("x", shape=(5, 8))
    h = relay.nn.relu(relay.nn.bias_add(relay.nn.dense(x, relay.const(w1)), relay.const(b1)))
    lib = build(relay.Function([x], relay.nn.dense(h, relay.const(w2))))
    return lib, lambda a: np.maximum(a @ w1.T + b1, 0) @ w2.T


def unaligned(a: np.ndarray) -> np.ndarray:
    """A copy of `a` whose data sits one byte off its dtype's alignment."""
    raw = np.zeros(a.nbytes + 1, np.uint8)
    out = raw[1:].view(a.dtype).reshape(a.shape)
    out[...] = a
    assert not out.flags.aligned
    return out


def read_only(a: np.ndarray) -> np.ndarray:
    out = a.copy()
    out.setflags(write=False)
    return out


# -- input layouts: every run computes on C-ordered data ------------------------------------------------

LAYOUTS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "fortran": np.asfortranarray,
    "transposed": lambda a: np.ascontiguousarray(a.T).T,
    "strided": lambda a: np.repeat(a, 2, axis=1)[:, ::2],
    "negative strides": lambda a: np.ascontiguousarray(a[::-1, ::-1])[::-1, ::-1],
    "read-only": read_only,
    "unaligned": unaligned,
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_inputs_of_any_layout_give_numpy_results_on_the_checked_and_the_fast_path(layout: str) -> None:
    ex = dense_model().create_executor()
    x = RNG.standard_normal((4, 8)).astype("float32")
    w = RNG.standard_normal((3, 8)).astype("float32")
    arranged = LAYOUTS[layout](x)
    np.testing.assert_array_equal(arranged, x)
    np.testing.assert_allclose(ex(x=arranged, w=w), x @ w.T, rtol=1e-5, atol=1e-6)  # the checked run
    ex(x=x, w=w)
    assert ex._entries is not None  # later runs call the native entries on data pointers
    for _ in range(2):
        np.testing.assert_allclose(ex(x=arranged, w=LAYOUTS[layout](w)), x @ w.T, rtol=1e-5, atol=1e-6)


def test_an_input_bound_by_set_input_is_a_c_ordered_copy_where_it_has_to_be() -> None:
    ex = dense_model().create_executor()
    x = RNG.standard_normal((4, 8)).astype("float32")
    w = RNG.standard_normal((3, 8)).astype("float32")
    ex(x=x, w=w)
    f = np.asfortranarray(x)
    ex.set_input("x", f)
    f[...] = 0  # a copy was bound: changing the caller's Fortran array later changes nothing
    ex.run()
    np.testing.assert_allclose(ex.get_output(0), x @ w.T, rtol=1e-5, atol=1e-6)


BAD_INPUTS: dict[str, tuple[Any, str]] = {
    "float64 array": (np.zeros((4, 8)), "input 'x': expected dtype float32, got float64"),
    "big-endian array": (np.zeros((4, 8), ">f4"), "input 'x': expected dtype float32, got >f4"),
    "wrong shape": (np.zeros((2, 8), np.float32), r"input 'x': expected shape \(4, 8\), got \(2, 8\)"),
    "fortran wrong shape": (np.zeros((8, 4), np.float32, order="F"),
                            r"input 'x': expected shape \(4, 8\), got \(8, 4\)"),
    "scalar": (3.0, r"input 'x': expected shape \(4, 8\), got \(\)"),
    "ragged list": ([[1.0] * 8, [1.0] * 7], "input 'x': expected an array of float32, got list"),
    "list of strings": ([["a"] * 8] * 4, "input 'x': expected float32 values, got a list of <U1"),
    "list with None": ([[None] * 8] * 4, "input 'x': expected float32 values, got a list of object"),
    "overflowing list": ([[1e300] * 8] * 4, "input 'x': the list holds values that dtype float32 cannot represent"),
    "not an array": (object(), "input 'x': expected dtype float32, got object"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_inputs_are_refused_naming_the_model_input_on_both_paths(case: str) -> None:
    value, message = BAD_INPUTS[case]
    w = np.ones((3, 8), np.float32)
    fresh = dense_model().create_executor()
    warm = dense_model().create_executor()
    warm(x=np.ones((4, 8), np.float32), w=w)
    warm(x=np.ones((4, 8), np.float32), w=w)
    for ex in (fresh, warm):
        with pytest.raises(runtime.ExecutorError, match=message) as info:
            ex(x=value, w=w)
        assert "fused_" not in str(info.value) and "p0" not in str(info.value)


def test_lists_and_python_numbers_take_the_input_dtype_when_nothing_is_lost() -> None:
    x = relay.var("x", shape=(2, 3))
    s = relay.var("s", shape=())
    i = relay.var("i", shape=(3,), dtype="int32")
    ex = build(relay.Function([x, s, i], relay.Tuple([relay.multiply(x, s), relay.add(i, i)]))).create_executor()
    xs = [[1, 2, 3], [4, 5, 6]]  # Python ints for a float32 input
    got_x, got_i = ex(x=xs, s=0.5, i=(1, -2, 2**30))
    np.testing.assert_array_equal(got_x, np.array(xs, np.float32) * np.float32(0.5))
    assert got_x.dtype == np.float32
    np.testing.assert_array_equal(got_i, np.array([2, -4, 2**31], np.int64).astype(np.int32))
    got_x, _ = ex(x=xs, s=True, i=[0, 0, 0])  # a bool is a number
    np.testing.assert_array_equal(got_x, np.array(xs, np.float32))
    with pytest.raises(runtime.ExecutorError, match="input 'i': the list holds values that dtype int32 cannot"):
        ex(x=xs, s=1.0, i=[1.5, 2, 3])
    with pytest.raises(runtime.ExecutorError, match="input 'i': the list holds values that dtype int32 cannot"):
        ex(x=xs, s=1.0, i=[2**31, 0, 0])
    with pytest.raises(runtime.ExecutorError, match="input 'i': expected dtype int32, got int64"):
        ex(x=xs, s=1.0, i=np.array([1, 2, 3]))  # an array's dtype is the caller's choice: no conversion
    with pytest.raises(runtime.ExecutorError, match="input 's': expected dtype float32, got float64"):
        ex(x=xs, s=np.float64(1.0), i=[1, 2, 3])  # a numpy scalar has a dtype too


def test_zero_dim_inputs() -> None:
    s, v = relay.var("s", shape=()), relay.var("v", shape=(4,))
    ex = build(relay.Function([s, v], relay.Tuple([relay.multiply(s, v), relay.exp(s)]))).create_executor()
    v_in = RNG.standard_normal(4).astype("float32")
    for value in (np.float32(2.0), np.array(2.0, np.float32), 2.0, 2, read_only(np.array(2.0, np.float32))):
        for _ in range(2):
            scaled, e = ex(s=value, v=v_in)
            np.testing.assert_allclose(scaled, 2 * v_in, rtol=1e-6)
            assert e.shape == () and e.dtype == np.float32
            np.testing.assert_allclose(e, np.exp(np.float32(2.0)), rtol=1e-6)


class _OrderKeepingCupy:
    """The part of cupy that `_Device.put` uses, as cupy behaves where it matters here.

    `cupy.asarray` of a numpy array keeps its memory order (its default order is "K"), so a
    Fortran array arrives Fortran-ordered on the device; `cupy.ndarray.copy()` is C-ordered.
    """

    class ndarray:
        def __init__(self, a: np.ndarray) -> None:
            self.a = a
            self.flags = a.flags
            self.dtype, self.shape = a.dtype, a.shape
            self.device = SimpleNamespace(id=0)
            self.data = SimpleNamespace(ptr=a.ctypes.data)

        def copy(self) -> _OrderKeepingCupy.ndarray:
            return _OrderKeepingCupy.ndarray(self.a.copy(order="C"))

    @staticmethod
    def asarray(a: np.ndarray) -> _OrderKeepingCupy.ndarray:
        return _OrderKeepingCupy.ndarray(np.array(a, order="K", copy=True))

    cuda = SimpleNamespace(Device=lambda: SimpleNamespace(id=0))


def test_device_put_makes_host_and_device_arrays_c_ordered(monkeypatch: pytest.MonkeyPatch) -> None:
    from kiln.runtime import cuda_module

    monkeypatch.setattr(cuda_module, "_cupy", lambda: _OrderKeepingCupy)
    dev = _Device()
    x = RNG.standard_normal((4, 8)).astype("float32")
    for host in (np.asfortranarray(x), np.repeat(x, 2, axis=0)[::-2][::-1], x):  # Fortran, strided, C
        put = dev.put(host)
        assert put.flags.c_contiguous and dev.fits(put)
        np.testing.assert_array_equal(put.a, x)
    on_device = _OrderKeepingCupy.ndarray(np.asfortranarray(x))
    assert not dev.fits(on_device)
    put = dev.put(on_device)
    assert put.flags.c_contiguous and put is not on_device
    np.testing.assert_array_equal(put.a, x)
    assert not dev.fits(x)  # a numpy array always goes to the device through put


# -- DLPack inputs (torch, jax) and the CUDA fast path -------------------------------------------------


class HostDLPack:
    """Only the DLPack protocol of a host array, as a CPU torch tensor or jax array offers it."""

    def __init__(self, a: np.ndarray, device_type: int = 1) -> None:
        self.a = a
        self.device_type = device_type

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self.a.__dlpack__(**kwargs)  # max_version: a versioned, writeable export

    def __dlpack_device__(self) -> tuple[int, int]:
        return (self.device_type, 0)


class RefusingDLPack(HostDLPack):
    """A producer that refuses to export, as torch does for a tensor that requires grad."""

    def __dlpack__(self, **kwargs: Any) -> Any:
        raise RuntimeError("Can't export tensors that require gradient, use tensor.detach()")


def test_dlpack_inputs_on_the_cpu_are_read_in_place() -> None:
    ex = dense_model().create_executor()
    x = RNG.standard_normal((4, 8)).astype("float32")
    w = RNG.standard_normal((3, 8)).astype("float32")
    for _ in range(2):  # the checked run, then the fast path
        np.testing.assert_allclose(ex(x=HostDLPack(x), w=HostDLPack(w)), x @ w.T, rtol=1e-5, atol=1e-6)
    ex.set_input("x", HostDLPack(x))
    assert np.shares_memory(ex._state.bound[ex._names["x"]], x)  # no copy
    fortran = np.asfortranarray(x)  # a layout the kernels cannot take is copied, as a numpy one is
    np.testing.assert_allclose(ex(x=HostDLPack(fortran), w=w), x @ w.T, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("value", "message"), [
    (HostDLPack(np.zeros((4, 8))), "input 'x': expected dtype float32, got float64"),
    (HostDLPack(np.zeros((8, 4), np.float32)), r"input 'x': expected shape \(4, 8\), got \(8, 4\)"),
    (HostDLPack(np.zeros((4, 8), np.float32), device_type=2), "input 'x': a HostDLPack on DLPack device type 2, "
                                                               "not in host memory; this library runs on the CPU"),
    (RefusingDLPack(np.zeros((4, 8), np.float32)), "input 'x': numpy cannot read this RefusingDLPack through "
                                                   "DLPack .RuntimeError: Can't export tensors that require grad"),
])
def test_bad_dlpack_inputs_are_refused_naming_the_input(value: Any, message: str) -> None:
    with pytest.raises(runtime.ExecutorError, match=message):
        dense_model().create_executor()(x=value, w=np.ones((3, 8), np.float32))


CHAIN_C = RNG.standard_normal((2, 16)).astype("float32")
CHAIN_B = RNG.standard_normal(16).astype("float32")


def chain_numpy(x: np.ndarray) -> np.ndarray:
    return np.maximum(x * CHAIN_C + CHAIN_B, 0)


def cuda_chain(target: str = "cuda -arch=sm_90") -> tuple[Library, np.ndarray, np.ndarray]:
    """x * C, + B, relu: three launches (FuseOps off) with intermediates between them; an input; its result."""
    x = relay.var("x", shape=(2, 16))
    with PassContext(opt_level=3, disabled_pass=["FuseOps"]):
        func = relay.Function([x], relay.nn.relu(relay.add(relay.multiply(x, relay.const(CHAIN_C)),
                                                           relay.const(CHAIN_B))))
        lib = build(func, target=target)
    a = RNG.standard_normal((2, 16)).astype("float32")
    return lib, a, chain_numpy(a)


@cuda_standin.needs_gxx
def test_device_dlpack_inputs_are_used_in_place_and_host_ones_copied_over(monkeypatch: pytest.MonkeyPatch,
                                                                         tmp_path: Any) -> None:
    cuda_standin.install(monkeypatch, tmp_path)
    lib, x, want = cuda_chain()
    ex = lib.create_executor()
    on_device = HostArray(x)
    for value in (DLPackOnDevice(on_device), HostDLPack(x), DLPackOnDevice(HostArray(np.asfortranarray(x)))):
        for _ in range(2):
            out = ex(x=value)
            assert isinstance(out, HostArray)
            np.testing.assert_allclose(out.get(), want, rtol=1e-4, atol=1e-5)
    ex.set_input("x", DLPackOnDevice(on_device))
    assert ex._state.bound[ex._names["x"]].data.ptr == on_device.data.ptr  # cupy.from_dlpack: no copy
    with pytest.raises(runtime.ExecutorError, match=r"input 'x': expected shape \(2, 16\), got \(16, 2\)"):
        ex(x=DLPackOnDevice(HostArray(x.T)))
    with pytest.raises(runtime.ExecutorError, match="input 'x': expected dtype float32, got float64"):
        ex(x=DLPackOnDevice(HostArray(x.astype("float64"))))
    with pytest.raises(runtime.ExecutorError, match="input 'x': a DLPackOnDevice on DLPack device type 10, which "
                                                    "is neither the host nor a CUDA GPU"):
        ex(x=DLPackOnDevice(on_device, device_type=10))  # ROCm


def _named_launches(launches: Any, start: int, names: dict[int, str]) -> list[tuple[Any, ...]]:
    """The launches from `start` on, each argument a name where it is a known pointer."""
    return [(*launch, tuple(names.get(a, a) for a in args))
            for launch, args in zip(launches[start:], launches.arguments[start:], strict=True)]


@cuda_standin.needs_gxx
def test_the_cuda_fast_path_launches_what_the_checked_path_does(monkeypatch: pytest.MonkeyPatch,
                                                                tmp_path: Any) -> None:
    launches = cuda_standin.install(monkeypatch, tmp_path)
    lib, x, want = cuda_chain()
    ex = lib.create_executor()
    g = lib.graph
    fixed = {v.data.ptr: f"slot {s}" for s, v in enumerate(ex._values) if v is not None}  # constants, intermediates
    runs = []
    for n in range(3):
        start = len(launches)
        out = ex(x=x)
        np.testing.assert_allclose(out.get(), want, rtol=1e-4, atol=1e-5)
        names = {**fixed, ex._state.bound[g.inputs[0]].data.ptr: "x", out.data.ptr: "output"}
        runs.append(_named_launches(launches, start, names))
        if n == 0:
            assert ex._cuda is not None  # bound after the checked run
            # from now on no module checks anything: the fast path launches on its own
            monkeypatch.setattr(CudaModule, "__call__", lambda *a: pytest.fail("the checked path ran"))
    assert runs[0] == runs[1] == runs[2]
    assert [name for name, *_ in runs[0]] == ["fused_0_kernel0", "fused_1_kernel0", "fused_2_kernel0"]
    assert all(isinstance(a, str) for run in runs for *_, args in run for a in args)  # every pointer is known
    assert runs[0][0][-1][0] == "x" and runs[0][2][-1][-1] == "output"


@cuda_standin.needs_gxx
def test_the_cuda_fast_path_is_left_when_the_current_device_changes(monkeypatch: pytest.MonkeyPatch,
                                                                    tmp_path: Any) -> None:
    cuda_standin.install(monkeypatch, tmp_path)
    lib, x, _ = cuda_chain()
    ex = lib.create_executor()
    ex(x=x)
    assert ex._cuda is not None
    monkeypatch.setattr(FAKE_CUPY.cuda, "Device", lambda: SimpleNamespace(id=1, compute_capability="90"))
    # the executor's buffers are on device 0: the checked path says so, where the fast path would launch
    with pytest.raises(runtime.ArgumentError, match="on device 0, the kernels run on the current device 1"):
        ex(x=x)


@cuda_standin.needs_gxx
def test_a_cuda_graph_replays_the_fast_path_between_copies_of_inputs_and_outputs(monkeypatch: pytest.MonkeyPatch,
                                                                                 tmp_path: Any) -> None:
    launches = cuda_standin.install(monkeypatch, tmp_path)
    lib, x, _ = cuda_chain()
    ex = lib.create_executor(cuda_graph=True)
    outs = []
    for n in range(4):  # the checked run, then the capture and three replays, each on other inputs
        xn = x * (n - 1.5)
        outs.append(ex(x=xn))
        np.testing.assert_allclose(outs[-1].get(), chain_numpy(xn), rtol=1e-5, atol=1e-6)
    assert ex._graph_launch is not None and ex._graph_launch.launched == 3
    assert len({o.data.ptr for o in outs}) == 4  # every run's output is an array of its own
    names = [name for name, *_ in launches]
    assert names == ["fused_0_kernel0", "fused_1_kernel0", "fused_2_kernel0"] * 4
    buffers = {b.data.ptr for b in ex._graph_buffers.values()}
    assert launches.arguments[-3][0] in buffers and launches.arguments[-1][-1] in buffers  # what it captured on
    with pytest.raises(runtime.ExecutorError, match="cuda_graph=True replays CUDA launches; this library is for llvm"):
        dense_model().create_executor(cuda_graph=True)


@pytest.mark.gpu
@cuda_standin.gpu
def test_gpu_cuda_graph_matches_the_launches_one_by_one() -> None:
    import cupy

    lib, _, _ = cuda_chain("cuda")
    plain, graphed = lib.create_executor(), lib.create_executor(cuda_graph=True)
    outs = []
    for _ in range(4):
        x = RNG.standard_normal((2, 16)).astype("float32")
        want = plain(x=x).get()
        got = graphed(x=cupy.asarray(x))
        outs.append(got)
        np.testing.assert_array_equal(got.get(), want)
        np.testing.assert_allclose(want, chain_numpy(x), rtol=1e-5, atol=1e-6)
    assert graphed._graph is not None and len({o.data.ptr for o in outs}) == 4


@pytest.mark.gpu
@cuda_standin.gpu
def test_gpu_torch_and_cupy_dlpack_inputs_are_used_without_a_copy() -> None:
    import cupy

    lib, x, want = cuda_chain("cuda")
    ex = lib.create_executor()
    on_gpu = cupy.asarray(x)
    ex.set_input("x", DLPackOnDevice(on_gpu))  # only the protocol: cupy.from_dlpack reads it
    assert ex._state.bound[ex._names["x"]].data.ptr == on_gpu.data.ptr
    ex.run()
    np.testing.assert_allclose(ex.get_output(0).get(), want, rtol=1e-5, atol=1e-6)
    torch = pytest.importorskip("torch")
    t = torch.from_numpy(x).cuda()
    for _ in range(2):
        out = ex(x=t)
        assert isinstance(out, cupy.ndarray)
        np.testing.assert_allclose(out.get(), want, rtol=1e-5, atol=1e-6)
    ex.set_input("x", t)
    assert ex._state.bound[ex._names["x"]].data.ptr == t.data_ptr()
    np.testing.assert_allclose(ex(x=torch.from_numpy(x)).get(), want, rtol=1e-5, atol=1e-6)  # a host tensor
    np.testing.assert_allclose(ex(x=t.T.contiguous().T).get(), want, rtol=1e-5, atol=1e-6)  # column-major
    with pytest.raises(runtime.ExecutorError, match="input 'x': expected dtype float32, got float64"):
        ex(x=t.double())


@pytest.mark.gpu
@cuda_standin.gpu
def test_gpu_fast_path_matches_the_checked_path() -> None:
    func, params = models.cnn(size=8, channels=(2, 4))
    x = RNG.standard_normal((1, 3, 8, 8)).astype("float32")
    lib = build(func, target="cuda", params=params)
    ex = lib.create_executor()
    checked = ex(x=x).get()
    assert ex._cuda is not None
    for _ in range(3):
        np.testing.assert_array_equal(ex(x=x).get(), checked)
    np.testing.assert_allclose(checked, models.cnn_numpy(x, params), rtol=1e-3, atol=1e-4)


# -- threads --------------------------------------------------------------------------------------------


def run_threads(n: int, work: Callable[[int], None]) -> None:
    """Runs `work(i)` in `n` threads started together; re-raises the first failure."""
    start = threading.Barrier(n)
    errors: list[BaseException] = []

    def body(i: int) -> None:
        try:
            start.wait()
            work(i)
        except BaseException as e:  # handed to the main thread
            errors.append(e)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a thread did not finish (deadlock?)"
    if errors:
        raise errors[0]


def test_one_executor_shared_by_8_threads_gives_every_call_its_own_result() -> None:
    lib, reference = mlp_model(hidden=512)  # kernels long enough (GIL released) for threads to overlap
    ex = lib.create_executor()
    wrong: list[tuple[int, int, float]] = []

    def work(i: int) -> None:
        rng = np.random.default_rng(i)
        for n in range(200):
            x = rng.standard_normal((5, 8)).astype("float32")
            if n % 2:
                got = ex(x=x)
            else:  # the three-step form: the bound input and the output are this thread's
                ex.set_input("x", x)
                ex.run()
                got = ex.get_output(0)
            want = reference(x)
            if not np.allclose(got, want, rtol=1e-4, atol=1e-3):
                wrong.append((i, n, float(np.abs(got - want).max())))

    run_threads(8, work)
    assert not wrong, f"{len(wrong)} of 1600 calls were wrong, e.g. {wrong[:3]}"


def test_inputs_set_in_one_thread_are_not_seen_by_another() -> None:
    lib, _ = mlp_model()
    ex = lib.create_executor()
    ex.set_input("x", np.ones((5, 8), np.float32))
    ex.run()
    seen: list[str] = []

    def other(_: int) -> None:
        for call in (ex.run, lambda: ex.get_output(0)):
            try:
                call()
            except runtime.ExecutorError as e:
                seen.append(str(e))

    run_threads(1, other)
    assert seen == ["inputs not set: ['x']; set them with set_input(name, array) in this thread",
                    "get_output before run() (outputs are per thread: run in this thread first)"]
    assert ex.get_output(0).shape == (5, 4)  # this thread's output is still here


def test_a_failed_call_binds_none_of_its_inputs() -> None:
    ex = dense_model().create_executor()
    x, w = np.ones((4, 8), np.float32), np.ones((3, 8), np.float32)
    ex(x=x, w=w)
    with pytest.raises(runtime.ExecutorError, match="input 'w'"):
        ex(x=2 * x, w=np.ones((3, 7), np.float32))
    ex.run()
    np.testing.assert_array_equal(ex.get_output(0), x @ w.T)  # still x, not 2 * x


def test_separate_executors_of_one_library_in_8_threads() -> None:
    lib, reference = mlp_model()

    def work(i: int) -> None:
        ex = lib.create_executor()
        rng = np.random.default_rng(100 + i)
        for _ in range(100):
            x = rng.standard_normal((5, 8)).astype("float32")
            np.testing.assert_allclose(ex(x=x), reference(x), rtol=1e-4, atol=1e-4)

    run_threads(8, work)


def test_one_kiln_build_module_called_from_8_threads() -> None:
    n = 1000
    a = te.placeholder((n,), name="a")
    b = te.placeholder((n,), name="b")
    c = te.compute((n,), lambda i: a[i] * b[i] + a[i], name="c")
    s = te.create_schedule(c)
    outer, inner = s[c].split(c.op.axis[0], factor=8)
    s[c].vectorize(inner)
    s[c].parallel(outer)
    mod = kiln.build(s, [a, b, c])

    def work(i: int) -> None:
        rng = np.random.default_rng(200 + i)
        for _ in range(200):
            x, y = rng.standard_normal((2, n)).astype("float32")
            out = np.empty(n, np.float32)
            mod(x, y, out)
            np.testing.assert_allclose(out, x * y + x, rtol=1e-5, atol=1e-6)

    run_threads(8, work)


def test_concurrent_relay_builds_give_correct_kernels() -> None:
    def model(i: int) -> tuple[relay.Function, Callable[[np.ndarray], np.ndarray]]:
        x = relay.var("x", shape=(3, 4 + i % 2))  # two threads per model: the same kernel built at once
        k = float(i // 2 + 1)
        body = relay.nn.relu(relay.add(relay.multiply(x, relay.const(k)), relay.sum(x, axis=1, keepdims=True)))
        return relay.Function([x], body), lambda a: np.maximum(a * k + a.sum(axis=1, keepdims=True), 0)

    def work(i: int) -> None:
        func, reference = model(i)
        ex = build(func).create_executor()
        x = np.random.default_rng(300 + i).standard_normal((3, 4 + i % 2)).astype("float32")
        np.testing.assert_allclose(ex(x=x), reference(x), rtol=1e-5, atol=1e-5)

    run_threads(4, work)


# -- empty values --------------------------------------------------------------------------------------


def ones(*shape: int) -> relay.Expr:
    return relay.const(np.ones(shape, np.float32))


EMPTY_MODELS: dict[str, Callable[[relay.Var], relay.Expr]] = {
    "dense": lambda x: relay.nn.dense(x, ones(3, 8)),
    "two dense layers": lambda x: relay.nn.dense(relay.nn.relu(relay.nn.dense(x, ones(3, 8))), ones(2, 3)),
    "elementwise": lambda x: relay.add(relay.exp(x), x),
    "softmax": lambda x: relay.nn.softmax(x),
    "sum over the empty axis": lambda x: relay.sum(relay.nn.relu(x), axis=0),
    "mean over the empty axis": lambda x: relay.mean(x, axis=0),
    "sum of all": lambda x: relay.sum(relay.exp(x)),
    "sum along the full axis": lambda x: relay.sum(x, axis=1),
    "empty then full": lambda x: relay.exp(relay.sum(relay.multiply(x, x), axis=0)),
}


# dense weights are 8 wide; softmax's numpy reference fails on an empty softmax axis (numpy's max of nothing)
EMPTY_CASES = [pytest.param(case, shape, id=f"{case}, {shape}") for case in EMPTY_MODELS
               for shape in [(0, 8), (4, 0)] if shape == (0, 8) or case not in ("dense", "two dense layers", "softmax")]


@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "unfused"])
@pytest.mark.parametrize(("case", "shape"), EMPTY_CASES)
def test_zero_size_dims_build_run_and_match_the_reference(case: str, shape: tuple[int, int], fuse: bool) -> None:
    x = relay.var("x", shape=shape)
    func = relay.Function([x], EMPTY_MODELS[case](x))
    with PassContext(opt_level=3, disabled_pass=[] if fuse else ["FuseOps"]):
        lib = build(func)
    ex = lib.create_executor()
    a = np.zeros(shape, np.float32)
    with warnings.catch_warnings():  # numpy's mean of nothing warns
        warnings.simplefilter("ignore", RuntimeWarning)
        want = relay.create_executor("debug", kiln.ir.module.IRModule.from_expr(func)).evaluate()(a)
    for _ in range(2):  # the checked run, then the fast path
        got = ex(x=a)
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)  # sums of nothing are 0, means of nothing nan


@cuda_standin.needs_gxx
def test_zero_size_values_on_a_cuda_library_through_the_host_stand_in(monkeypatch: pytest.MonkeyPatch,
                                                                      tmp_path: Any) -> None:
    launches = cuda_standin.install(monkeypatch, tmp_path)
    x = relay.var("x", shape=(0, 8))
    with PassContext(opt_level=3, disabled_pass=["FuseOps"]):
        func = relay.Function([x], relay.Tuple([EMPTY_MODELS["two dense layers"](x), relay.sum(relay.exp(x), axis=0)]))
        ex = build(func, target="cuda -arch=sm_90").create_executor()
    empty, sums = ex(x=np.zeros((0, 8), np.float32))
    assert empty.shape == (0, 2)
    np.testing.assert_array_equal(sums.get(), np.zeros(8, np.float32))
    assert [name for name, *_ in launches] == [launches[0][0]]  # only the sum has work to do


def test_empty_values_survive_export_and_load(tmp_path: Any) -> None:
    x = relay.var("x", shape=(0, 8))
    with PassContext(opt_level=3, disabled_pass=["FuseOps"]):
        lib = build(relay.Function([x], relay.Tuple([EMPTY_MODELS["empty then full"](x), relay.nn.relu(x)])))
    path = tmp_path / "empty.kiln"
    lib.export(path)
    for library in (lib, runtime.load(path)):
        ex = library.create_executor()
        for _ in range(2):
            full, empty = ex(x=np.zeros((0, 8), np.float32))
            np.testing.assert_array_equal(full, np.ones(8, np.float32))
            assert empty.shape == (0, 8) and empty.dtype == np.float32


def test_an_empty_reduction_axis_inside_dense() -> None:
    x, w = relay.var("x", shape=(4, 0)), relay.var("w", shape=(3, 0))
    ex = build(relay.Function([x, w], relay.nn.dense(x, w))).create_executor()
    for _ in range(2):
        got = ex(x=np.zeros((4, 0), np.float32), w=np.zeros((3, 0), np.float32))
        np.testing.assert_array_equal(got, np.zeros((4, 3), np.float32))


# -- huge values ---------------------------------------------------------------------------------------


def test_relay_build_refuses_tensors_with_more_elements_than_the_kernels_index() -> None:
    x = relay.var("x", shape=(2**40, 8))
    with pytest.raises(BuildError, match=r"input 'x' has type Tensor\[\(1099511627776, 8\), float32\]: "
                                         r"8796093022208 elements, more than the 2147483647 that kiln's kernels index"):
        build(relay.Function([x], relay.exp(x)))
    a, b = relay.var("a", shape=(2**16, 1)), relay.var("b", shape=(1, 2**16))  # each fits, their sum does not
    with pytest.raises(BuildError, match=r"the result of add \(at .*test_executor\.py:\d+\) has type "
                                         r"Tensor\[\(65536, 65536\), float32\]: 4294967296 elements"):
        build(relay.Function([a, b], relay.add(a, b)))


def test_a_huge_fused_result_names_the_nodes_it_came_from() -> None:
    # spans are the ONNX node names; the bias that SimplifyInference makes of batch_norm keeps its node's
    x, y = relay.var("x", shape=(1, 2, 2**15, 1)), relay.var("y", shape=(1, 1, 1, 2**15))
    c = [relay.const(np.ones(2, np.float32)) for _ in range(4)]
    with span_scope(Span("add_1")):
        xy = relay.add(x, y)
    with span_scope(Span("bn_2")):
        bn = relay.TupleGetItem(relay.nn.batch_norm(xy, *c), 0)
    with span_scope(Span("relu_3")):
        out = relay.nn.relu(bn)
    with pytest.raises(BuildError, match=r"the result of add\+multiply\+nn\.relu \(at add_1, bn_2, relu_3\) has type"):
        build(relay.Function([x, y], out))


@pytest.mark.parametrize("symbolic", [True, False], ids=["symbolic dims", "static dims"])
def test_a_kiln_build_module_refuses_arrays_with_more_elements_than_it_indexes(symbolic: bool) -> None:
    # a fused loop over n * m int32 iterations wrapped to 0 for n = m = 2**16: the kernel silently did nothing
    shape = (te.var("n"), te.var("m")) if symbolic else (2**16, 2**16)
    a = te.placeholder(shape, name="A", dtype="uint8")
    b = te.compute(shape, lambda i, j: a[i, j] + te.const(1, "uint8"), name="B")
    s = te.create_schedule(b)
    s[b].fuse(*b.op.axis)
    mod = kiln.build(s, [a, b])
    huge = np.broadcast_to(np.zeros(1, np.uint8), (2**16, 2**16))  # no memory: refused before anything reads it
    with pytest.raises(runtime.ArgumentError, match=r"parameter 'A': shape \(65536, 65536\) has 4294967296 "
                                                    "elements, more than the 2147483647 that kernels index"):
        mod(huge, huge)


def test_the_executor_refuses_a_graph_with_more_elements_than_the_kernels_index() -> None:
    lib = dense_model()
    g = lib.graph
    # a graph that did not come from relay.build (a library file, say) with a shape whose int64
    # element count wraps around to 0: Python ints see it for what it is
    out = g.outputs[0]
    g.slots[out] = attrs.evolve(g.slots[out], shape=(2**32, 2**32))
    assert int(np.prod(g.slots[out].shape, dtype=np.int64)) == 0
    assert slot_bytes(g.slots[out]) == 2**66
    with pytest.raises(runtime.ExecutorError, match=r"output 0 \(float32\[4294967296, 4294967296\], made by "
                                                    r"nn.dense \(at .*\)\) has shape \(4294967296, 4294967296\): "
                                                    f"{2**64} elements, more than the {MAX_ELEMENTS}"):
        lib.create_executor()


def test_the_executor_refuses_negative_sizes_in_a_graph() -> None:
    lib = dense_model()
    g = lib.graph
    out = g.outputs[0]
    g.slots[out] = attrs.evolve(g.slots[out], shape=(4, -3))
    with pytest.raises(runtime.ExecutorError, match=r"output 0 \(float32\[4, -3\], made by nn.dense "
                                                    r"\(at .*\)\) has a negative dim: shape \(4, -3\)"):
        lib.create_executor()
    g.storage_sizes.append(-1)
    with pytest.raises(runtime.ExecutorError, match=r"intermediate buffer 0 has a negative size \(-1 bytes\)"):
        lib.create_executor()


def test_outputs_larger_than_the_machine_are_refused_before_anything_is_allocated() -> None:
    x = relay.var("x", shape=(MAX_ELEMENTS,), dtype="float64")
    e = relay.exp(x)
    lib = build(relay.Function([x], relay.Tuple([e] * 128)))  # 128 outputs of 16 GiB each
    with pytest.raises(runtime.KernelMemoryError, match=r"output 0 \(float64\[2147483647\], made by exp "
                                                        r"\(at .*\)\) needs 16\.0 GiB \(17179869176 bytes\); "
                                                        r"this model's intermediates and outputs need 2\.0 TiB in all, "
                                                        r"more than the .* of memory of this machine"):
        lib.create_executor()


def test_intermediates_larger_than_memory_are_refused_naming_the_op(monkeypatch: pytest.MonkeyPatch) -> None:
    x = relay.var("x", shape=(1024, 1024))
    with PassContext(opt_level=3, disabled_pass=["FuseOps"]):
        lib = build(relay.Function([x], relay.sum(relay.exp(x), axis=1)))
    monkeypatch.setattr(executor_module, "host_memory_bytes", lambda: 3 << 20)
    with pytest.raises(runtime.KernelMemoryError, match=r"intermediate buffer 0 \(for the intermediate value "
                                                        r"float32\[1024, 1024\], made by exp \(at .*\)\) "
                                                        r"needs 4\.0 MiB \(4194304 bytes\); .* need 4\.0 MiB in all, "
                                                        r"more than the 3\.0 MiB of memory of this machine"):
        lib.create_executor()


def test_failed_allocations_are_kiln_errors_naming_the_buffer(monkeypatch: pytest.MonkeyPatch) -> None:
    lib, _ = mlp_model()

    def no_memory(*_: Any) -> Any:
        raise MemoryError

    monkeypatch.setattr(executor_module, "_aligned", no_memory)
    with pytest.raises(runtime.KernelMemoryError, match=r"intermediate buffer 0 \(for the intermediate value "
                                                        r"float32\[5, 16\], made by nn.dense\+nn.bias_add\+nn.relu "
                                                        r"\(at .*\)\): cannot allocate 320 bytes \(320 bytes\)"):
        lib.create_executor()
    monkeypatch.undo()
    ex = lib.create_executor()
    monkeypatch.setattr(executor_module._Host, "empty", staticmethod(no_memory))
    with pytest.raises(runtime.KernelMemoryError, match=r"output 0 \(float32\[5, 4\], made by nn.dense \(at .*\)\): "
                                                        "cannot allocate 80 bytes"):
        ex(x=np.ones((5, 8), np.float32))
    monkeypatch.setattr(executor_module._Host, "put", staticmethod(no_memory))
    with pytest.raises(runtime.KernelMemoryError, match=r"input 'x' \(a copy\): cannot allocate 160 bytes"):
        ex(x=np.ones((5, 8), np.float32, order="F"))


def test_host_memory_is_known_and_sizes_print_in_binary_units(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    mem = executor_module.host_memory_bytes()
    assert mem is not None and mem > 2**28
    v2, v1 = tmp_path / "memory.max", tmp_path / "memory.limit_in_bytes"
    monkeypatch.setattr(executor_module, "_CGROUP_LIMIT_FILES", (str(v2), str(v1)))
    v2.write_text("max\n")  # no limit
    assert executor_module.host_memory_bytes() == mem
    v1.write_text(f"{2**30}\n")  # a container's limit, lower than the machine's memory
    assert executor_module.host_memory_bytes() == min(mem, 2**30)
    assert [executor_module.format_bytes(n) for n in (0, 1023, 1024, 3 << 29, 2**41)] == [
        "0 bytes", "1023 bytes", "1.0 KiB", "1.5 GiB", "2.0 TiB"]
