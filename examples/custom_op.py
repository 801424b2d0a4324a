"""A new op in one file: declared, used in a model, built and run on the CPU, compiled to CUDA C."""
import attrs
import numpy as np
from kiln import relay, te
from kiln.ir.attrs import Attrs
from kiln.registry import OpPattern, attr, register_op
from kiln.relay.op import constructor

@attrs.frozen
class ScaleAttrs(Attrs):
    factor: float = 1.0

def scale_compute(attrs, inputs, out_type):  # x * factor, element by element
    (x,) = inputs
    return [te.compute(x.shape, lambda *i: x[i] * te.const(attrs.factor, x.dtype), name="scale")]

def schedule_cpu(sch, anchor_outs, outs, target):  # all axes as one loop, 16 lanes at a time
    s = sch[outs[0]]
    s.vectorize(s.split(s.fuse(*s.op.axis), factor=16)[1])

def schedule_cuda(sch, anchor_outs, outs, target):  # one GPU thread per element
    s = sch[outs[0]]
    block, thread = s.split(s.fuse(*s.op.axis), factor=256)
    s.bind(block, te.thread_axis("blockIdx.x"))
    s.bind(thread, te.thread_axis("threadIdx.x"))

(register_op("my.scale").describe("x * factor").add_argument("data", "Tensor", "the input")
    .set_attrs_type(ScaleAttrs).add_type_rel("Identity", lambda types, attrs: types[0])
    .set_attr(attr.TOpPattern, OpPattern.ELEMWISE).set_attr(attr.FCompute, scale_compute)
    .set_attr(attr.FSchedule["llvm"], schedule_cpu).set_attr(attr.FSchedule["cuda"], schedule_cuda))

@constructor("my.scale")
def scale(data: relay.Expr, factor: float = 1.0) -> relay.Call:
    return relay.call("my.scale", [data], ScaleAttrs(factor))

x = relay.var("x", shape=(8, 64))
func = relay.Function([x], scale(relay.nn.relu(x), factor=3.0))  # relu fuses into my.scale's kernel
data = np.random.default_rng(0).standard_normal((8, 64)).astype("float32")
np.testing.assert_allclose(relay.build(func).create_executor()(x=data), np.maximum(data, 0) * 3, rtol=1e-6)
print(relay.build(func, target="cuda -arch=sm_90").kernels[0].get_source("cuda"))
