"""kiln's CUDA kernels beside cupy (cuBLAS) and torch on the same GPU, in one run.

    python bench/gpu.py [--sections chain,matmul,convs,zoo,models] [--repeat N]

Prints, with the GPU's name (each section on its own; a section that fails
prints its error and the others still run):
- chain: the elementwise chain of bench/kernels.py, sigmoid(x*2+1)*tanh(x) on
  2^26 float32 through relay.build (one fused kernel), as achieved GB/s (8
  bytes moved per element), as a fraction of the device's theoretical memory
  bandwidth and of what a cupy copy achieves, and beside cupy evaluating the
  same expression (unfused, and fused with `cupy.fuse`);
- matmul: 4096^3 `nn.matmul` through relay.build in float32 and in float16
  (float16 inputs, float32 accumulation: out_dtype float32), as TFLOP/s and as
  a ratio to `cupy.matmul` (cuBLAS) on the same inputs; and in bfloat16
  (float32 sums) beside torch.matmul on the same bfloat16 tensors;
- convs: single convolution layers (split-K at batch 1, NHWC, depthwise,
  grouped) beside torch's cuDNN in float32;
- zoo: every model of `kiln.testing.zoo` at batch 1 compiled for cuda, its
  output checked against onnxruntime's CPU provider (max error) and timed;
- models: the zoo's ResNet-50 at batch 1 and 32 and its BERT-base encoder at
  batch 8 x seq 128, kiln beside torch eager on the same GPU (torchvision's
  resnet50 and transformers' BertModel of the same sizes, random weights, eval
  mode), float32 with TF32 off in torch (kiln computes in float32), and torch's
  default (TF32 convolutions) as a second column; kiln also as one CUDA graph
  (`create_executor(cuda_graph=True)`).

Times are medians of CUDA-event timings after warm-up runs. The aims (issue
19): the chain at 80% of the memory bandwidth, both matmuls at half of cuBLAS
or better, ResNet-50 and BERT at or ahead of torch eager. Needs a CUDA GPU;
without one it says so and exits 0.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np

from kiln import relay


def gpu_time(fn: Callable[[], object], cupy: Any, repeat: int = 20) -> float:
    """The median seconds of `fn()` on the GPU, by CUDA events, after two warm-up runs."""
    for _ in range(2):
        fn()
    cupy.cuda.Device().synchronize()
    times = []
    for _ in range(repeat):
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop) / 1e3)
    return statistics.median(times)


def chain(cupy: Any, peak_gbs: float, args: argparse.Namespace) -> None:
    n = 1 << 26
    x = relay.var("x", shape=(n,))
    y = relay.multiply(relay.sigmoid(relay.add(relay.multiply(x, relay.const(2.0)), relay.const(1.0))), relay.tanh(x))
    ex = relay.build(relay.Function([x], y), target="cuda").create_executor()  # one fused kernel
    xv = cupy.random.standard_normal(n, dtype=cupy.float32)

    def expression(v: Any) -> Any:
        return 1 / (1 + cupy.exp(-(v * 2 + 1))) * cupy.tanh(v)

    np.testing.assert_allclose(ex(x=xv).get(), expression(xv).get(), rtol=1e-5, atol=1e-6)
    fused = cupy.fuse(expression)
    t_kiln = gpu_time(lambda: ex(x=xv), cupy, args.repeat)
    t_cupy = gpu_time(lambda: expression(xv), cupy, args.repeat)
    t_fuse = gpu_time(lambda: fused(xv), cupy, args.repeat)
    t_copy = gpu_time(lambda: cupy.copyto(cupy.empty_like(xv), xv), cupy, args.repeat)
    gbs = 8 * n / t_kiln / 1e9
    print(f"elementwise chain 2^26 f32: kiln {t_kiln * 1e3:.3f} ms, {gbs:.0f} GB/s ({gbs / peak_gbs:.0%} of the "
          f"theoretical peak, {t_copy / t_kiln:.0%} of a cupy copy's {8 * n / t_copy / 1e9:.0f} GB/s); cupy "
          f"{t_cupy * 1e3:.3f} ms ({t_cupy / t_kiln:.2f}x kiln's time), cupy.fuse {t_fuse * 1e3:.3f} ms "
          f"({t_fuse / t_kiln:.2f}x)")


def matmul(cupy: Any, peak_gbs: float, args: argparse.Namespace) -> None:
    del peak_gbs
    for dtype, out_dtype, rtol in (("float32", None, 1e-3), ("float16", "float32", 2e-2)):
        _matmul_one(cupy, 4096, dtype, out_dtype, rtol, max(3, args.repeat // 4))
    import torch

    matmul_bf16(torch, cupy, 4096, max(3, args.repeat // 4))


def _matmul_one(cupy: Any, size: int, dtype: str, out_dtype: str | None, rtol: float, repeat: int) -> None:
    a = relay.var("a", shape=(size, size), dtype=dtype)
    b = relay.var("b", shape=(size, size), dtype=dtype)
    start = time.perf_counter()
    lib = relay.build(relay.Function([a, b], relay.nn.matmul(a, b, out_dtype=out_dtype)), target="cuda")
    compile_s = time.perf_counter() - start
    ex = lib.create_executor()
    av = cupy.random.random((size, size), dtype=cupy.float32).astype(dtype)
    bv = cupy.random.random((size, size), dtype=cupy.float32).astype(dtype)
    out = ex(a=av, b=bv)
    np.testing.assert_allclose(out.get(), cupy.matmul(av, bv).get().astype(np.float32), rtol=rtol)
    t_kiln = gpu_time(lambda: ex(a=av, b=bv), cupy, repeat)
    t_blas = gpu_time(lambda: cupy.matmul(av, bv), cupy, repeat)
    flops = 2 * size**3
    print(f"matmul {size}^3 {dtype}: kiln {t_kiln * 1e3:.2f} ms, {flops / t_kiln / 1e12:.1f} TFLOP/s "
          f"(compile {compile_s:.1f} s); cuBLAS {t_blas * 1e3:.2f} ms, {flops / t_blas / 1e12:.1f} TFLOP/s; "
          f"kiln at {t_blas / t_kiln:.2f}x cuBLAS's speed")


def matmul_bf16(torch: Any, cupy: Any, size: int, repeat: int) -> None:
    """bfloat16 inputs, float32 sums (tensor cores), beside torch.matmul on the same bfloat16 tensors."""
    a = relay.var("a", shape=(size, size), dtype="bfloat16")
    b = relay.var("b", shape=(size, size), dtype="bfloat16")
    ex = relay.build(relay.Function([a, b], relay.nn.matmul(a, b, out_dtype="float32")),
                     target="cuda").create_executor()
    at = torch.rand((size, size), device="cuda").bfloat16()
    bt = torch.rand((size, size), device="cuda").bfloat16()
    out = ex(a=at, b=bt)  # DLPack: the torch tensors are used in place
    want = (at.float() @ bt.float()).cpu().numpy()
    np.testing.assert_allclose(cupy.asnumpy(out), want, rtol=1e-2)
    t_kiln = gpu_time(lambda: ex(a=at, b=bt), cupy, repeat)
    t_torch = gpu_time(lambda: torch.matmul(at, bt), cupy, repeat)
    flops = 2 * size**3
    print(f"matmul {size}^3 bfloat16 -> float32: kiln {t_kiln * 1e3:.2f} ms, {flops / t_kiln / 1e12:.1f} TFLOP/s; "
          f"torch (bf16 out) {t_torch * 1e3:.2f} ms, {flops / t_torch / 1e12:.1f} TFLOP/s; kiln at "
          f"{t_torch / t_kiln:.2f}x torch's speed")


# (name, batch, in channels, out channels, image, kernel, stride, groups, layout): the layers whose
# schedules bench/RESULTS.md has no timing of yet
CONV_LAYERS = [
    ("ResNet-50 stage 4 3x3 (split-K)", 1, 512, 512, 7, 3, 1, 1, "NCHW"),
    ("ResNet-50 stage 4 3x3", 32, 512, 512, 7, 3, 1, 1, "NCHW"),
    ("ResNet-50 stage 1 3x3", 1, 64, 64, 56, 3, 1, 1, "NCHW"),
    ("ResNet-50 stage 1 3x3 NHWC", 1, 64, 64, 56, 3, 1, 1, "NHWC"),
    ("MobileNetV2 depthwise 112^2", 1, 96, 96, 112, 3, 2, 96, "NCHW"),
    ("MobileNetV2 depthwise 14^2", 1, 576, 576, 14, 3, 1, 576, "NCHW"),
    ("ConvNeXt depthwise 7x7 56^2", 1, 96, 96, 56, 7, 1, 96, "NCHW"),
    ("ResNeXt grouped 3x3 (32 groups)", 1, 256, 256, 28, 3, 1, 32, "NCHW"),
]


def convs(cupy: Any, peak_gbs: float, args: argparse.Namespace) -> None:
    """Single convolution layers, float32, kiln beside torch (cuDNN, TF32 off) on the same inputs."""
    del peak_gbs
    import torch

    torch.backends.cudnn.allow_tf32 = False
    rng = np.random.default_rng(0)
    for name, n, c, o, size, k, stride, groups, layout in CONV_LAYERS:
        x = rng.standard_normal((n, c, size, size), dtype=np.float32)
        w = (rng.standard_normal((o, c // groups, k, k)) / np.sqrt(c // groups * k * k)).astype(np.float32)
        xt, wt = torch.as_tensor(x, device="cuda"), torch.as_tensor(w, device="cuda")
        want = torch.nn.functional.conv2d(xt, wt, stride=stride, padding=k // 2, groups=groups)
        xin = x if layout == "NCHW" else x.transpose(0, 2, 3, 1).copy()
        wk = w if layout == "NCHW" else w.transpose(2, 3, 1, 0).copy()
        xv = relay.var("x", shape=xin.shape)
        y = relay.nn.conv2d(xv, relay.const(wk), strides=(stride, stride), padding=(k // 2, k // 2), groups=groups,
                            data_layout=layout, kernel_layout="OIHW" if layout == "NCHW" else "HWIO")
        lib = relay.build(relay.Function([xv], y), target="cuda")
        ex = lib.create_executor()
        xd = cupy.asarray(xin)
        got = cupy.asnumpy(ex(x=xd))
        got = got if layout == "NCHW" else got.transpose(0, 3, 1, 2)
        err = float(np.abs(got - want.cpu().numpy()).max())
        t_kiln = gpu_time(functools.partial(ex, x=xd), cupy, args.repeat)
        t_torch = gpu_time(functools.partial(torch.nn.functional.conv2d, xt, wt, stride=stride, padding=k // 2,
                                             groups=groups), cupy, args.repeat)
        flops = 2 * want.numel() * (c // groups) * k * k
        print(f"conv {name}: kiln {t_kiln * 1e6:.0f} us ({flops / t_kiln / 1e12:.1f} TFLOP/s, {len(lib.kernels)} "
              f"launches), torch {t_torch * 1e6:.0f} us; kiln at {t_torch / t_kiln:.2f}x torch's speed; "
              f"max error {err:.1e}")


def _zoo_executor(name: str, shape: dict[str, tuple[int, ...]] | None = None,
                  cuda_graph: bool = False) -> tuple[Any, Any, float]:
    from kiln.relay.frontend.onnx import from_onnx
    from kiln.testing import zoo

    model = zoo.build(name)
    start = time.perf_counter()
    mod, params = from_onnx(model, shape=shape)
    ex = relay.build(mod, target="cuda", params=params).create_executor(cuda_graph=cuda_graph)
    return model, ex, time.perf_counter() - start


def zoo_check(cupy: Any, peak_gbs: float, args: argparse.Namespace) -> None:
    del peak_gbs
    import onnxruntime as ort

    from kiln.testing import zoo

    for name in zoo.ZOO:
        try:
            model, ex, compile_s = _zoo_executor(name)
            feed = zoo.inputs(model, seed=1)
            ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feed)
            dfeed = {k: cupy.asarray(v) for k, v in feed.items()}
            out = ex(**dfeed)
            outs = list(out) if isinstance(out, tuple) else [out]
            err = max(float(np.max(np.abs(cupy.asnumpy(a).astype(np.float64) - r))) for a, r in zip(outs, ref,
                                                                                                  strict=True))
            t = gpu_time(lambda: ex(**dfeed), cupy, args.repeat)  # noqa: B023 (called right here)
            print(f"zoo {name:16s} batch 1: max error vs onnxruntime CPU {err:.1e}, kiln {t * 1e3:.2f} ms "
                  f"(compile {compile_s:.1f} s)")
        except Exception as exc:  # one model's failure does not hide the others
            print(f"zoo {name}: FAILED {type(exc).__name__}: {exc}")


def _torch_times(torch: Any, net: Any, x: Any, cupy: Any, repeat: int) -> tuple[float, float]:
    """torch eager's median seconds: fp32 with TF32 off, then with torch's defaults."""
    defaults = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
    times = []
    with torch.no_grad():
        for flags in ((False, False), defaults):
            torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = flags
            times.append(gpu_time(lambda: net(*x), cupy, repeat))
    return times[0], times[1]


def _top_kernels(what: str, ex: Any, lines: int = 16, **inputs: Any) -> None:
    """The head of the executor's per-kernel profile (each launch synchronized): where the time goes."""
    profile = str(ex.profile(repeat=5, **inputs)).splitlines()
    print(f"{what}: per-kernel profile (head)\n  " + "\n  ".join(profile[:lines]))


def models(cupy: Any, peak_gbs: float, args: argparse.Namespace) -> None:
    del peak_gbs
    import torch

    rng = np.random.default_rng(0)
    for batch in (1, 32):
        _, ex, compile_s = _zoo_executor("resnet50", {"input": (batch, 3, 224, 224)})
        x = cupy.asarray(rng.standard_normal((batch, 3, 224, 224), dtype=np.float32))
        t_kiln = gpu_time(lambda: ex(input=x), cupy, args.repeat)  # noqa: B023
        _, graph_ex, _ = _zoo_executor("resnet50", {"input": (batch, 3, 224, 224)}, cuda_graph=True)
        t_graph = gpu_time(lambda: graph_ex(input=x), cupy, args.repeat)  # noqa: B023
        print(f"ResNet-50 batch {batch}: kiln as one CUDA graph {t_graph * 1e3:.2f} ms")
        _top_kernels(f"ResNet-50 batch {batch}", ex, input=x)
        import torchvision

        net = torchvision.models.resnet50().cuda().eval()
        fp32, default = _torch_times(torch, net, (torch.as_tensor(x, device="cuda"),), cupy, args.repeat)
        print(f"ResNet-50 batch {batch}: kiln {t_kiln * 1e3:.2f} ms (compile {compile_s:.1f} s); torch eager fp32 "
              f"{fp32 * 1e3:.2f} ms (kiln at {fp32 / t_kiln:.2f}x its speed), torch's defaults {default * 1e3:.2f} ms "
              f"(kiln at {default / t_kiln:.2f}x)")
    batch, seq = 8, 128
    _, ex, compile_s = _zoo_executor("bert_base", {"input_ids": (batch, seq), "attention_mask": (batch, seq)})
    ids = cupy.asarray(rng.integers(0, 30522, (batch, seq)))
    mask = cupy.ones((batch, seq), dtype=cupy.int64)
    t_kiln = gpu_time(lambda: ex(input_ids=ids, attention_mask=mask), cupy, args.repeat)
    _, graph_ex, _ = _zoo_executor("bert_base", {"input_ids": (batch, seq), "attention_mask": (batch, seq)},
                                   cuda_graph=True)
    t_graph = gpu_time(lambda: graph_ex(input_ids=ids, attention_mask=mask), cupy, args.repeat)
    print(f"BERT-base encoder batch {batch} x seq {seq}: kiln as one CUDA graph {t_graph * 1e3:.2f} ms")
    _top_kernels("BERT-base", ex, input_ids=ids, attention_mask=mask)
    import transformers

    config = transformers.BertConfig(num_hidden_layers=2, hidden_size=768, num_attention_heads=12,
                                     intermediate_size=3072)
    bert = transformers.BertModel(config, add_pooling_layer=False).cuda().eval()
    fp32, default = _torch_times(torch, bert, (torch.as_tensor(ids, device="cuda"),
                                               torch.as_tensor(mask, device="cuda")), cupy, args.repeat)
    print(f"BERT-base encoder (2 layers) batch {batch} x seq {seq}: kiln {t_kiln * 1e3:.2f} ms (compile "
          f"{compile_s:.1f} s); torch eager fp32 {fp32 * 1e3:.2f} ms (kiln at {fp32 / t_kiln:.2f}x its speed), "
          f"torch's defaults {default * 1e3:.2f} ms (kiln at {default / t_kiln:.2f}x)")


SECTIONS: dict[str, Callable[[Any, float, argparse.Namespace], None]] = {
    "chain": chain, "matmul": matmul, "convs": convs, "zoo": zoo_check, "models": models,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated: " + ", ".join(SECTIONS))
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args(argv)
    try:
        import cupy
    except ImportError:
        print("bench/gpu.py: cupy is not installed (pip install -e '.[cuda]'); nothing to measure")
        return 0
    if not cupy.cuda.is_available():
        print("bench/gpu.py: no CUDA GPU on this machine; nothing to measure")
        return 0
    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    peak_gbs = 2 * props["memoryClockRate"] * 1e3 * props["memoryBusWidth"] / 8 / 1e9
    print(f"GPU: {name}, theoretical memory bandwidth {peak_gbs:.0f} GB/s; cupy {cupy.__version__}")
    for section in args.sections.split(","):
        try:
            SECTIONS[section](cupy, peak_gbs, args)
        except Exception:  # one section's failure does not hide the others
            print(f"section {section}: FAILED")
            traceback.print_exc(limit=4)
    return 0


if __name__ == "__main__":
    sys.exit(main())
