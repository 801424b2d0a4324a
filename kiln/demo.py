"""The main job that `make demo` (`kiln demo`) runs: two models, from Python to machine code.

For each of `kiln.testing.models.mlp()` (batch 64, 784 -> 512 -> 512 -> 10,
relu) and `kiln.testing.models.cnn()` (conv3x3-batch_norm-relu-maxpool twice,
global average pool, dense 10; batch 1, 3x224x224) it prints the typed IR, the
IR after relay.build's passes with the fusion report, compiles for the host
CPU, checks the outputs against the reference interpreter
(`relay.create_executor("debug", mod)`) and against numpy, and times kiln
against numpy running the same model. A short table sums up, and the last
lines show, for each op of the models, the fusion pattern and the kernel
implementation the registry chose.

`main(models, repeat)` takes the models to run, so tests run the same code on
small ones (`small_models()`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import attrs
import numpy as np

from kiln import relay
from kiln.bench import median_seconds
from kiln.errors import KilnError
from kiln.ir.module import IRModule
from kiln.progress import ProgressBar
from kiln.registry import Op, attr
from kiln.relay.backend.build_module import optimize_explained
from kiln.relay.backend.strategy import select_implementation
from kiln.relay.printer import astext
from kiln.relay.transform.fuse_ops import PATTERN_NAMES
from kiln.relay.visitor import post_order
from kiln.target import Target
from kiln.testing import models

RTOL, ATOL = 1e-3, 1e-4  # float32 sums of a few thousand terms, in another order than numpy's


class DemoError(KilnError, AssertionError):
    """The compiled model disagrees with the reference: the demo's check failed."""


@attrs.frozen
class DemoModel:
    """A model of the demo: its Relay function and weights, an input, and numpy running the same model."""

    name: str
    description: str
    func: relay.Function
    params: dict[str, np.ndarray]
    x: np.ndarray
    numpy: Callable[[np.ndarray], np.ndarray]


@attrs.frozen
class ModelResult:
    """What the demo measured for one model."""

    name: str
    kernels: int
    compile_s: float
    kiln_s: float
    numpy_s: float
    max_abs_error: float
    ops: tuple[str, ...] = ()  # the ops left after the passes, which the kernels compute

    @property
    def speed_vs_numpy(self) -> float:
        """numpy's time over kiln's: above 1, kiln is faster."""
        return self.numpy_s / self.kiln_s


def _model(name: str, description: str, built: tuple[relay.Function, dict[str, np.ndarray]],
           x_shape: tuple[int, ...], numpy: Callable[[np.ndarray, dict[str, np.ndarray]], np.ndarray]) -> DemoModel:
    func, params = built
    x = np.random.default_rng(1).standard_normal(x_shape).astype("float32")
    return DemoModel(name, description, func, params, x, lambda v: numpy(v, params))


def default_models() -> list[DemoModel]:
    """The two models of the main job, at full size."""
    return [
        _model("mlp", "batch 64, 784 -> 512 -> 512 -> 10, relu", models.mlp(), (64, 784), models.mlp_numpy),
        _model("cnn", "batch 1, 3x224x224, (conv3x3-bn-relu-maxpool) x2, global avg pool, dense 10",
               models.cnn(), (1, 3, 224, 224), models.cnn_numpy),
    ]


def small_models() -> list[DemoModel]:
    """The same two models, small enough for the tests."""
    return [
        _model("mlp", "batch 4, 16 -> 8 -> 8 -> 3, relu", models.mlp(batch=4, sizes=(16, 8, 8, 3)), (4, 16),
               models.mlp_numpy),
        _model("cnn", "batch 1, 3x8x8, channels 4 and 4", models.cnn(size=8, channels=(4, 4)), (1, 3, 8, 8),
               models.cnn_numpy),
    ]


def _section(title: str) -> None:
    print(f"\n-- {title}")


def _max_abs_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)))) if got.size else 0.0


def _check(model: DemoModel, what: str, got: np.ndarray, want: np.ndarray) -> float:
    """The max abs error of `got` against `want`; DemoError beyond tolerance, naming where they part."""
    ok = got.shape == want.shape and np.allclose(got, want, rtol=RTOL, atol=ATOL)
    err = _max_abs_error(got, want) if got.shape == want.shape else float("inf")
    print(f"against {what}: max abs error {err:.3g} (rtol {RTOL:g}, atol {ATOL:g}): {'ok' if ok else 'MISMATCH'}")
    if not ok:
        from kiln.testing.compare import compare

        where = compare(model.func, {"x": model.x}, model.params, rtol=RTOL, atol=ATOL)
        raise DemoError(f"{model.name}: the compiled output differs from {what}"
                        + (f"; {where}" if where is not None else ""))
    return err


def run_model(model: DemoModel, target: Target, repeat: int = 7) -> ModelResult:
    """Shows, compiles, checks and times one model; prints as it goes.

    Args:
        model: the model and its input.
        target: the llvm target to compile for.
        repeat: how many timed runs each median takes.

    Returns:
        The measurements.

    Raises:
        DemoError: the compiled model's output is off the reference beyond tolerance.
    """
    print(f"\n======== {model.name}: {model.description}")
    mod = relay.transform.InferType()(IRModule.from_expr(model.func))
    _section("the IR as built with the Python API, typed (relay.transform.InferType)")
    print(str(mod), end="")

    fused, report = optimize_explained(mod, model.params)
    _section("after relay.build's passes: weights bound as constants, simplified, fused "
             "(large constants shown as meta[...])")
    print(astext(fused, show_meta_data=False), end="")
    _section("why the groups are what they are (relay.transform.fusion_report, before FuseOps)")
    print(report)

    _section(f"compile for {target.summary()}")
    bar = ProgressBar(f"compiling {model.name}")
    start = time.perf_counter()
    try:
        lib = relay.build(model.func, target=target, params=model.params, progress=bar)
    finally:
        bar.finish()
    compile_s = time.perf_counter() - start
    print(f"{len(lib.kernels)} kernels in {compile_s:.2f} s (compiled kernels are cached on disk), "
          f"intermediates planned into {lib.planned_bytes / 2**20:.2f} MiB")

    _section("run and check")
    ex = lib.create_executor()
    got = ex(x=model.x)
    assert isinstance(got, np.ndarray)
    reference = relay.create_executor("debug", mod)(x=model.x, **model.params)
    err = _check(model, "the reference interpreter", got, np.asarray(reference))
    _check(model, "numpy", got, model.numpy(model.x))

    _section(f"time (median of {repeat} runs)")
    kiln_s = median_seconds(lambda: ex(x=model.x), repeat, warmup=3)
    numpy_s = median_seconds(lambda: model.numpy(model.x), repeat, warmup=3)
    ops = {node.op.name: None for node in post_order(fused["main"].body)
           if isinstance(node, relay.Call) and isinstance(node.op, Op)}
    result = ModelResult(model.name, len(lib.kernels), compile_s, kiln_s, numpy_s, err, tuple(ops))
    print(f"kiln {kiln_s * 1e3:.3f} ms, numpy {numpy_s * 1e3:.3f} ms: "
          f"kiln runs at {result.speed_vs_numpy:.2f}x numpy's speed")
    return result


def print_summary(results: Sequence[ModelResult]) -> None:
    """The table of every model's kernels, compile time, run times and speed against numpy."""
    print("\n======== summary")
    print(f"{'model':6} {'kernels':>7} {'compile':>9} {'kiln':>11} {'numpy':>11} {'vs numpy':>9} {'max err':>9}")
    for r in results:
        print(f"{r.name:6} {r.kernels:7d} {r.compile_s:7.2f} s {r.kiln_s * 1e3:8.3f} ms {r.numpy_s * 1e3:8.3f} ms "
              f"{r.speed_vs_numpy:8.2f}x {r.max_abs_error:9.2g}")
    print("(vs numpy: numpy's time over kiln's, higher is better for kiln)")


def print_op_table(results: Sequence[ModelResult], target: Target) -> None:
    """For each op the kernels compute: the TOpPattern that FuseOps read and the implementation lowering chose."""
    print("\n======== the registry behind it (`kiln ops NAME` shows an op in full)")
    print(f"  {'op':20} {'TOpPattern':22} implementation for {target.kind.name}, float32")
    pattern = Op.get_attr_map(attr.TOpPattern)
    for name in dict.fromkeys(name for r in results for name in r.ops):
        op = Op.get(name)
        pat = PATTERN_NAMES[pattern[op]] if op in pattern else "-"
        try:
            impl = select_implementation(name, target, ["float32"])
        except KilnError as err:
            print(f"  {name:20} {pat:22} none ({err})")
            continue
        site = f", {impl.site.file}:{impl.site.line}" if impl.site is not None else ""
        print(f"  {name:20} {pat:22} {impl.name} (priority {impl.priority}{site})")


def main(demo_models: Sequence[DemoModel] | None = None, repeat: int = 7, onnx: bool = True) -> list[ModelResult]:
    """Runs the main job on `demo_models` (default: the MLP and the CNN at full size).

    Args:
        demo_models: the models; `small_models()` for a quick run.
        repeat: how many timed runs each median takes.
        onnx: also import the ONNX CNN and transformer block and run them beside onnxruntime.

    Returns:
        One result per model.
    """
    demo_models = default_models() if demo_models is None else list(demo_models)
    target = Target("llvm")
    print("kiln demo: models built with the Python API, fused, compiled to machine code for this CPU,")
    print("checked against the reference interpreter and timed against numpy running the same model.")
    print(f"host: {target['mcpu']}, {target['num-cores']} cores, triple {target['mtriple']}")
    results = [run_model(m, target, repeat) for m in demo_models]
    print_summary(results)
    print_op_table(results, target)
    run_training()
    if onnx:
        run_onnx_models(repeat)
    print("\nThe same from the command line, for a model in the text format (what `str(mod)` prints)")
    print("or an ONNX file:")
    print("  kiln show model.txt --fusion            kiln show model.onnx")
    print("  kiln compile model.txt --params weights.npz -o model.kiln")
    print("  kiln run model.kiln --input x=x.npy --output y.npy")
    print("  kiln bench model.onnx                   (kiln beside onnxruntime)")
    return results


def run_training(steps: int = 10) -> list[float]:
    """Trains an MLP with SGD on two Gaussian blobs: forward, loss, gradient and update compiled as one library.

    Returns:
        The loss before each step; a loss that does not fall is a DemoError.
    """
    from kiln.testing import models, train

    print("\n======== training: relay.transform.gradient, one compiled SGD step (kiln.testing.train)")
    func, params = models.mlp(batch=64, sizes=(32, 64, 64, 2))
    step = train.sgd_step(func, loss="softmax_cross_entropy", lr=0.02)
    x, labels = train.blobs(64, (32,), classes=2, spread=2.0)
    losses = []
    for _ in range(steps):
        loss, params = step(x, labels, params)
        losses.append(float(loss))
    print("loss by step: " + " ".join(f"{v:.4f}" for v in losses))
    if not losses[-1] < losses[0]:
        raise DemoError(f"training: the loss did not fall ({losses[0]:.4f} -> {losses[-1]:.4f})")
    return losses


def run_onnx_models(repeat: int) -> None:
    """Imports the ONNX CNN and transformer encoder block, and runs them beside onnxruntime."""
    try:
        import onnx  # noqa: F401  (kiln.testing.onnx_models needs it only once it builds a model)
    except ImportError:
        print("\n-- ONNX: skipped: the onnx package is not installed. pip install 'kiln[onnx]' adds this part: "
              "a CNN and a transformer block imported from ONNX, run and timed beside onnxruntime")
        return
    from kiln import bench
    from kiln.relay.frontend import from_onnx
    from kiln.testing import onnx_models

    for make in (onnx_models.cnn, onnx_models.transformer_encoder):
        _section(f"ONNX {make.__name__}: relay.frontend.from_onnx, relay.build, beside onnxruntime")
        model = make()
        mod, params = from_onnx(model)
        times = bench.compare(model, mod, params, repeat=max(repeat, 20))
        diff = times.get("max_abs_diff")
        if diff is not None and not diff <= 1e-4:
            raise DemoError(f"ONNX {make.__name__}: kiln and onnxruntime differ by {diff:.3g} (bar 1e-4)")
