"""Mutants of small ONNX models for tests/test_onnx_fuzz.py: seed models, mutations, the case sequence.

`mutated(name, seed)` is the serialized model of one fuzz case: the seed model
`name` (see SEEDS) after one to three mutations drawn from a generator seeded
with `seed`, and notes saying what was done. `case_at(i)` is the i-th case of
the fixed sequence that the fuzzer runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

# ---------------------------------------------------------------------------
# Seed models
# ---------------------------------------------------------------------------


def _onnx() -> Any:
    import onnx

    return onnx


def _model(nodes: list[Any], inputs: list[tuple[str, list[Any]]], outputs: list[str], inits: dict[str, Any],
           opset: int = 17) -> Any:
    onnx = _onnx()
    helper, f = onnx.helper, onnx.TensorProto.FLOAT
    graph = helper.make_graph(
        nodes, "seed", [helper.make_tensor_value_info(n, f, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, f, None) for n in outputs],
        [onnx.numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True).graph
    model.graph.ClearField("output")  # the outputs' shapes, as an exporter writes them
    model.graph.output.extend(inferred.output)
    onnx.checker.check_model(model, full_check=True)
    return model


def _w(*shape: int, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed + sum(shape)).standard_normal(shape) * 0.5).astype(np.float32)


def _i64(*values: int) -> np.ndarray:
    return np.array(values, np.int64)


def _node(op: str, ins: list[str], outs: list[str], **attrs: Any) -> Any:
    return _onnx().helper.make_node(op, ins, outs, name=f"{op.lower()}_{outs[0]}", **attrs)


def conv_bn_relu() -> Any:
    return _model([
        _node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        _node("BatchNormalization", ["c", "s", "bb", "m", "v"], ["n"], epsilon=1e-5),
        _node("Relu", ["n"], ["r"]),
        _node("MaxPool", ["r"], ["y"], kernel_shape=[2, 2], strides=[2, 2]),
    ], [("x", [1, 3, 6, 6])], ["y"], {
        "w": _w(4, 3, 3, 3), "b": _w(4), "s": np.abs(_w(4, seed=1)) + 0.5, "bb": _w(4, seed=2),
        "m": _w(4, seed=3), "v": np.abs(_w(4, seed=4)) + 0.5})


def gemm() -> Any:
    return _model([
        _node("Gemm", ["x", "w1", "b1"], ["h"], transB=1, alpha=0.5),
        _node("Relu", ["h"], ["r"]),
        _node("Gemm", ["r", "w2", "b2"], ["y"], beta=2.0),
    ], [("x", [2, 8])], ["y"], {"w1": _w(6, 8), "b1": _w(6), "w2": _w(6, 3), "b2": _w(1, 3)})


def layernorm() -> Any:
    return _model([
        _node("LayerNormalization", ["x", "s", "b"], ["n"], axis=-1, epsilon=1e-5),
        _node("Add", ["n", "x"], ["a"]),
        _node("Softmax", ["a"], ["y"], axis=-1),
    ], [("x", [2, 3, 4])], ["y"], {"s": np.abs(_w(4)) + 0.5, "b": _w(4, seed=1)})


def reshape_chain() -> Any:
    return _model([
        _node("Reshape", ["x", "shape"], ["r"]),
        _node("Transpose", ["r"], ["t"], perm=[1, 0]),
        _node("Slice", ["t", "starts", "ends", "axes", "steps"], ["s"]),
        _node("Concat", ["s", "t"], ["c"], axis=0),
        _node("Unsqueeze", ["c", "uaxes"], ["u"]),
        _node("Flatten", ["u"], ["y"], axis=2),
    ], [("x", [2, 3, 4])], ["y"], {
        "shape": _i64(4, -1), "starts": _i64(1, 0), "ends": _i64(5, 4), "axes": _i64(0, 1), "steps": _i64(2, 1),
        "uaxes": _i64(0)})


def split_concat() -> Any:
    return _model([
        _node("Split", ["x", "split"], ["a", "b"], axis=1),
        _node("Mul", ["a", "a"], ["m"]),
        _node("Neg", ["b"], ["n"]),
        _node("Concat", ["n", "m"], ["c"], axis=1),
        _node("ReduceSum", ["c", "raxes"], ["y"], keepdims=0),
    ], [("x", [2, 6])], ["y"], {"split": _i64(2, 4), "raxes": _i64(1)})


def pad_pool() -> Any:
    return _model([
        _node("Pad", ["x", "pads"], ["p"], mode="reflect"),
        _node("AveragePool", ["p"], ["a"], kernel_shape=[3, 3], strides=[2, 2]),
        _node("Sigmoid", ["a"], ["s"]),
        _node("GlobalMaxPool", ["s"], ["g"]),
        _node("Squeeze", ["g", "saxes"], ["y"]),
    ], [("x", [1, 2, 5, 5])], ["y"], {"pads": _i64(0, 0, 1, 1, 0, 0, 1, 1), "saxes": _i64(2, 3)})


def matmul_softmax() -> Any:
    return _model([
        _node("MatMul", ["x", "w"], ["m"]),
        _node("Softmax", ["m"], ["s"], axis=1),
        _node("Gather", ["s", "idx"], ["g"], axis=2),
        _node("Clip", ["g", "lo", "hi"], ["c"]),
        _node("Cast", ["c"], ["y"], to=_onnx().TensorProto.FLOAT),
    ], [("x", [2, 3, 4])], ["y"], {"w": _w(4, 5), "idx": _i64(0, -1, 2), "lo": np.float32(0.1),
                                  "hi": np.float32(0.9)})


def _cnn() -> Any:
    from kiln.testing import onnx_models

    return onnx_models.cnn()


def _transformer() -> Any:
    from kiln.testing import onnx_models

    return onnx_models.transformer_encoder()


# name -> (builder, weight): the two real models compile slowly, so they are drawn less often
SEEDS: dict[str, tuple[Callable[[], Any], int]] = {
    "conv_bn_relu": (conv_bn_relu, 3), "gemm": (gemm, 3), "layernorm": (layernorm, 3),
    "reshape_chain": (reshape_chain, 3), "split_concat": (split_concat, 3), "pad_pool": (pad_pool, 3),
    "matmul_softmax": (matmul_softmax, 3), "cnn": (_cnn, 1), "transformer": (_transformer, 1),
}


def case_at(index: int) -> tuple[str, int]:
    """The `index`-th case of the fixed sequence: (seed model, seed)."""
    rng = np.random.default_rng([index, 4242])
    names = list(SEEDS)
    weights = np.array([SEEDS[n][1] for n in names], np.float64)
    return names[int(rng.choice(len(names), p=weights / weights.sum()))], index


# ---------------------------------------------------------------------------
# Mutations
# ---------------------------------------------------------------------------

_OPS = ["Relu", "Conv", "Gemm", "Softmax", "Add", "Reshape", "Transpose", "Identity", "MaxPool", "Concat", "Split",
        "Squeeze", "Slice", "LayerNormalization", "BatchNormalization", "Frobnicate", "MatMul", "Gather", "Pad",
        "Cast", "ReduceMean", "Flatten", "Expand", "Tile", "Where"]
_INTS = [-(2**31), -5, -2, -1, 0, 1, 2, 3, 7, 2**31 - 1]
_FLOATS = [0.0, -1.0, 1e-12, 1e30, float("nan"), float("inf"), 0.5]
_STRINGS = ["", "SAME_UPPER", "VALID", "NOTSET", "reflect", "linear", "nonsense", "tanh"]
_DTYPES = [1, 2, 3, 4, 6, 7, 8, 9, 10, 11, 16, 999]


class _Mutator:
    def __init__(self, model: Any, rng: np.random.Generator) -> None:
        self.model, self.rng, self.onnx = model, rng, _onnx()
        self.graph = model.graph
        self.notes: list[str] = []
        self.data: bytes | None = None  # set by a byte flip: the mutated serialized model

    def pick(self, seq: Any) -> Any:
        return seq[int(self.rng.integers(len(seq)))]

    def values(self) -> list[str]:
        g = self.graph
        return [i.name for i in g.input] + [i.name for i in g.initializer] + [o for n in g.node for o in n.output]

    def node(self) -> Any:
        return self.pick(self.graph.node) if len(self.graph.node) else None

    # each mutation returns a note, or None when it does not apply to this model
    def drop_input(self) -> str | None:
        node = self.node()
        if node is None or not node.input:
            return None
        i = int(self.rng.integers(len(node.input)))
        if self.rng.random() < 0.5:
            node.input[i] = ""
            return f"input #{i} of {node.name} set to ''"
        del node.input[i]
        return f"input #{i} of {node.name} dropped"

    def add_input(self) -> str | None:
        node = self.node()
        if node is None:
            return None
        node.input.append(self.pick(self.values()))
        return f"{node.name} gets an extra input {node.input[-1]}"

    def attr_kind(self) -> str | None:
        node = self.node()
        if node is None:
            return None
        helper = self.onnx.helper
        name = self.pick([a.name for a in node.attribute]) if node.attribute and self.rng.random() < 0.8 else \
            self.pick(["axis", "alpha", "perm", "mode", "bogus", "kernel_shape", "to", "epsilon"])
        value = self.pick([1.5, 3, "text", [1, 2], [0.5, 1.5], ["a"],
                           self.onnx.numpy_helper.from_array(np.zeros(2, np.float32))])
        kept = [a for a in node.attribute if a.name != name]
        del node.attribute[:]
        node.attribute.extend([*kept, helper.make_attribute(name, value)])
        return f"attribute {name} of {node.name} := {value!r}"

    def attr_value(self) -> str | None:
        nodes = [n for n in self.graph.node if n.attribute]
        if not nodes:
            return None
        node = self.pick(nodes)
        attr = self.pick(node.attribute)
        t = self.onnx.AttributeProto
        if attr.type == t.INT:
            attr.i = self.pick(_INTS)
        elif attr.type == t.FLOAT:
            attr.f = self.pick(_FLOATS)
        elif attr.type == t.STRING:
            attr.s = self.pick(_STRINGS).encode()
        elif attr.type == t.INTS:
            values = list(attr.ints)
            what = int(self.rng.integers(3))
            if what == 0 and values:
                values[int(self.rng.integers(len(values)))] = self.pick(_INTS)
            elif what == 1 and values:
                values.pop()
            else:
                values.append(self.pick([0, 1, 2, -1]))
            del attr.ints[:]
            attr.ints.extend(values)
        else:
            return None
        return f"attribute {attr.name} of {node.name} changed"

    def _init(self) -> Any:
        return self.pick(self.graph.initializer) if len(self.graph.initializer) else None

    def init_dims(self) -> str | None:
        init = self._init()
        if init is None:
            return None
        dims = list(init.dims)
        what = int(self.rng.integers(3))
        if what == 0:
            dims.append(1)
        elif what == 1 and dims:
            dims.pop(int(self.rng.integers(len(dims))))
        elif dims:
            k = int(self.rng.integers(len(dims)))
            dims[k] = max(0, dims[k] + int(self.pick([-1, 1, 2])))
        del init.dims[:]
        init.dims.extend(dims)
        return f"dims of {init.name} := {dims}"

    def init_dtype(self) -> str | None:
        init = self._init()
        if init is None:
            return None
        init.data_type = self.pick(_DTYPES)
        return f"dtype of {init.name} := {init.data_type}"

    def init_raw(self) -> str | None:
        inits = [i for i in self.graph.initializer if i.raw_data]
        if not inits:
            return None
        init = self.pick(inits)
        raw = bytes(init.raw_data)
        cut = int(self.rng.integers(-4, 5))
        init.raw_data = raw[:cut] if cut < 0 else raw + bytes(cut)
        return f"raw_data of {init.name} {'cut' if cut < 0 else 'grown'} by {abs(cut)}"

    def init_values(self) -> str | None:
        """New values for an integer initializer (shapes, axes, starts, pads): the ones that decide shapes."""
        inits = [i for i in self.graph.initializer if i.data_type == self.onnx.TensorProto.INT64]
        if not inits:
            return None
        init = self.pick(inits)
        size = max(1, int(np.prod(init.dims)) + int(self.pick([0, 0, 0, -1, 1])))
        values = self.rng.integers(-3, 7, size=size).astype(np.int64)
        new = self.onnx.numpy_helper.from_array(values.reshape(-1) if len(init.dims) else values[:1].reshape(()),
                                                init.name)
        init.CopyFrom(new)
        return f"{init.name} := {values.tolist()}"

    def cycle(self) -> str | None:
        nodes = self.graph.node
        if len(nodes) < 2:
            return None
        j, k = sorted(int(v) for v in self.rng.choice(len(nodes), 2, replace=False))
        if not nodes[j].input or not nodes[k].output:
            return None
        nodes[j].input[int(self.rng.integers(len(nodes[j].input)))] = nodes[k].output[0]
        return f"{nodes[j].name} reads {nodes[k].output[0]} (a later node's output)"

    def dangling(self) -> str | None:
        node = self.node()
        if node is None or not node.input:
            return None
        node.input[int(self.rng.integers(len(node.input)))] = "ghost"
        return f"{node.name} reads 'ghost'"

    def duplicate_output(self) -> str | None:
        g = self.graph
        if self.rng.random() < 0.3 or len(g.node) < 2:
            g.output.append(g.output[0])
            return "the first graph output is listed twice"
        j, k = (int(v) for v in self.rng.choice(len(g.node), 2, replace=False))
        g.node[j].output[0] = g.node[k].output[0]
        return f"{g.node[j].name} writes {g.node[k].output[0]} too"

    def unknown_op(self) -> str | None:
        node = self.node()
        if node is None:
            return None
        node.op_type = self.pick(_OPS)
        return f"{node.name} becomes a {node.op_type}"

    def input_shape(self) -> str | None:
        inputs = [i for i in self.graph.input if i.type.tensor_type.HasField("shape")]
        if not inputs:
            return None
        vi = self.pick(inputs)
        shape = vi.type.tensor_type.shape
        what = int(self.rng.integers(4))
        if what == 0:
            shape.dim.add().dim_value = int(self.pick([1, 2]))
        elif what == 1 and len(shape.dim):
            del shape.dim[len(shape.dim) - 1]
        elif what == 2 and len(shape.dim):
            dim = shape.dim[int(self.rng.integers(len(shape.dim)))]
            if self.rng.random() < 0.3:
                dim.dim_param = "n"
            else:
                dim.dim_value = int(self.pick([0, 1, 2, 5]))
        else:
            vi.type.tensor_type.ClearField("shape")
        return f"shape of input {vi.name} changed"

    def input_dtype(self) -> str | None:
        vi = self.pick(self.graph.input)
        vi.type.tensor_type.elem_type = self.pick([1, 6, 7, 9, 10, 11, 4])
        return f"dtype of input {vi.name} := {vi.type.tensor_type.elem_type}"

    def opset(self) -> str | None:
        version = int(self.rng.integers(1, 22))
        self.model.opset_import[0].version = version
        return f"opset := {version}"

    def delete_node(self) -> str | None:
        g = self.graph
        if len(g.node) < 2:
            return None
        k = int(self.rng.integers(len(g.node)))
        name = g.node[k].name
        del g.node[k]
        return f"node {name} deleted"

    def schema_attr(self) -> str | None:
        """An attribute that the op does define, with a value of its kind: reaches the converters' own checks."""
        node = self.node()
        if node is None:
            return None
        import onnx.defs

        try:
            schema = onnx.defs.get_schema(node.op_type, self.model.opset_import[0].version, node.domain)
        except onnx.defs.SchemaError:
            return None
        if not schema.attributes:
            return None
        name = self.pick(sorted(schema.attributes))
        kind = schema.attributes[name].type
        t = onnx.defs.OpSchema.AttrType
        small = [-3, -2, -1, 0, 1, 1, 2, 3, 4]
        if kind == t.INT:
            value: Any = self.pick(small)
        elif kind == t.INTS:
            value = [int(v) for v in self.rng.choice(small, int(self.rng.integers(0, 5)))]
        elif kind == t.FLOAT:
            value = self.pick([0.0, 0.5, 1e-3, 2.0, -1.0])
        elif kind == t.STRING:
            value = self.pick(_STRINGS)
        else:
            return None
        kept = [a for a in node.attribute if a.name != name]
        del node.attribute[:]
        node.attribute.extend([*kept, self.onnx.helper.make_attribute(name, value, attr_type=int(kind))])
        return f"attribute {name} of {node.name} := {value!r}"

    _INSERTED: ClassVar[list[tuple[str, int, dict[str, Any]]]] = [
                 ("Relu", 1, {}), ("Sigmoid", 1, {}), ("Tanh", 1, {}), ("Abs", 1, {}), ("Neg", 1, {}),
                 ("Exp", 1, {}), ("Sqrt", 1, {}), ("Erf", 1, {}), ("Identity", 1, {}), ("Add", 2, {}),
                 ("Mul", 2, {}), ("Sub", 2, {}), ("Div", 2, {}), ("Max", 3, {}), ("Sum", 2, {}), ("Pow", 2, {}),
                 ("Log", 1, {}),
                 ("Softmax", 1, {"axis": -1}), ("Softmax", 1, {"axis": 0}), ("LogSoftmax", 1, {"axis": 1}),
                 ("Transpose", 1, {}), ("Flatten", 1, {"axis": 1}), ("Flatten", 1, {"axis": 0}),
                 ("ReduceMean", 1, {"keepdims": 1}), ("ReduceMax", 1, {"keepdims": 0}),
                 ("LeakyRelu", 1, {"alpha": 0.3}), ("HardSigmoid", 1, {}), ("Cast", 1, {"to": 11}),
                 ("Cast", 1, {"to": 1}), ("Shape", 1, {}), ("ArgMax", 1, {"axis": 0, "keepdims": 0}),
                 ("Dropout", 1, {}), ("Where", 0, {}), ("Concat", 2, {"axis": 0}), ("Concat", 2, {"axis": -1}),
                 ("Squeeze", 1, {}), ("MatMul", 2, {}), ("Greater", 2, {}), ("Floor", 1, {}), ("Sign", 1, {})]

    def insert_node(self) -> str | None:
        """A new node on an existing value, read by one of that value's readers or added as a graph output."""
        g, helper = self.graph, self.onnx.helper
        # placed before the reader it feeds (or last), reading only values defined above it: the node list
        # stays in topological order, which onnx.reference needs
        at = int(self.rng.integers(len(g.node) + 1))
        values = [i.name for i in g.input] + [o for n in g.node[:at] for o in n.output if o]
        if not values:
            return None
        v = source = self.pick(values)
        op, arity, attrs = self._INSERTED[int(self.rng.integers(len(self._INSERTED)))]
        out = f"ins{len(g.node)}"
        new = []
        if op in ("Sqrt", "Pow", "Log"):
            # on |v|: a nan made from finite values meets the open question of max pooling over nan
            # (onnxruntime and onnx.reference drop it from the window, kiln and numpy keep it); Log and Pow
            # on exp|v| >= 1, since near 0 they blow up the rounding differences of whatever computed v
            new.append(helper.make_node("Abs", [v], [f"{out}_abs"], name=f"{out}_abs"))
            v = f"{out}_abs"
            if op != "Sqrt":
                new.append(helper.make_node("Exp", [v], [f"{out}_exp"], name=f"{out}_exp"))
                v = f"{out}_exp"
        if op == "Div":  # by exp|w| >= 1: 0 / 0 is nan, which max pooling treats differently (see above)
            w = self.pick(values)
            new.append(helper.make_node("Abs", [w], [f"{out}_dabs"], name=f"{out}_dabs"))
            new.append(helper.make_node("Exp", [f"{out}_dabs"], [f"{out}_dexp"], name=f"{out}_dexp"))
            inputs = [v, f"{out}_dexp"]
        elif op == "Where":
            new.append(helper.make_node("Greater", [v, v], [f"{out}_c"], name=f"{out}_greater"))
            inputs = [f"{out}_c", v, self.pick(values)]
        else:
            inputs = [v] + [self.pick(values) if self.rng.random() < 0.3 else v for _ in range(arity - 1)]
        new.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        readers = [(i, k) for i, n in enumerate(g.node) if i >= at for k, name in enumerate(n.input)
                   if name == source]
        nodes = list(g.node)
        if readers and self.rng.random() < 0.6:
            i, k = self.pick(readers)
            nodes[i].input[k] = out
            note = f"{op} {out} inserted on {source}, read by {nodes[i].name}"
        else:
            g.output.append(helper.make_empty_tensor_value_info(out))
            note = f"{op} {out} inserted on {source}, a graph output"
        del g.node[:]
        g.node.extend(nodes[:at] + new + nodes[at:])
        return note

    def init_floats(self) -> str | None:
        """Special values in a float initializer: zeros, negatives, nan, inf (a variance of 0 or below, ...)."""
        inits = [i for i in self.graph.initializer if i.data_type == self.onnx.TensorProto.FLOAT]
        if not inits:
            return None
        init = self.pick(inits)
        try:
            values = self.onnx.numpy_helper.to_array(init).copy()
        except ValueError:  # an earlier mutation made its data not fit its dims
            return None
        if values.size == 0:
            return None
        special = self.pick([0.0, -1.0, np.nan, np.inf, -np.inf, 1e30])
        values.reshape(-1)[int(self.rng.integers(values.size))] = special
        init.CopyFrom(self.onnx.numpy_helper.from_array(values, init.name))
        return f"an element of {init.name} := {special}"

    def byte_flip(self) -> str | None:
        data = bytearray(self.model.SerializeToString())
        flips = int(self.rng.integers(1, 5))
        for _ in range(flips):
            k = int(self.rng.integers(len(data)))
            data[k] ^= int(self.rng.integers(1, 256))
        if self.rng.random() < 0.1:
            data = data[: int(self.rng.integers(len(data)))]
        self.data = bytes(data)
        return f"{flips} byte(s) flipped"

    # a weighted list: the mutations that keep a model valid-looking come more often, to reach the converters
    MUTATIONS = ("drop_input", "add_input", "attr_kind", "attr_value", "attr_value", "init_dims", "init_dtype",
                 "init_raw", "init_values", "init_values", "cycle", "dangling", "duplicate_output", "unknown_op",
                 "input_shape", "input_dtype", "opset", "delete_node", "byte_flip", "schema_attr", "schema_attr",
                 "schema_attr", "insert_node", "insert_node", "insert_node", "insert_node", "init_floats")

    def run(self) -> bytes:
        for _ in range(int(self.rng.integers(1, 4))):
            for _attempt in range(10):
                note = getattr(self, self.pick(self.MUTATIONS))()
                if note is not None:
                    self.notes.append(note)
                    break
            if self.data is not None:  # a byte flip is the last mutation: the result is no longer a proto
                break
        return self.data if self.data is not None else self.model.SerializeToString()


def mutated(name: str, seed: int) -> tuple[bytes, list[str]]:
    """The serialized model of case (name, seed), and what was done to it."""
    mutator = _Mutator(SEEDS[name][0](), np.random.default_rng([seed, 7]))
    data = mutator.run()
    return data, mutator.notes
