"""The ONNX importer: `from_onnx(model)` → (IRModule, params).

An ONNX graph is converted one node at a time, in topological order. Each node
goes to the converter registered for its (domain, op_type) and the model's
opset of that domain; converters are plain Python functions registered with
`@onnx_converter`, so a user adds one for a custom op without touching kiln:

```python
from kiln import relay
from kiln.relay.frontend import onnx_converter

@onnx_converter("Scale", domain="my.domain", since=1)
def _scale(node):
    return relay.multiply(node.input(0), relay.const(node.attr("factor", 1.0)))
```

A converter receives an `OnnxNode` (attributes, inputs as Relay expressions,
their types, their values when constant, and `error()` for a message naming the
node) and returns an expression per ONNX output. Every expression it builds
takes the node's name as its span, so a later type error names the ONNX node.

As each node is converted its result is typed (incrementally: what is typed
already is not walked again) and every call whose arguments are all constants
is evaluated at once, so shape arithmetic (Shape → Gather → Concat → Reshape)
folds to constants, as it does in TVM's importer.

Errors are kiln's: a model with unsupported ops fails once, listing every
(op_type, opset) and the nodes that use it; a malformed model (a node reading a
name nothing defines, a cycle, an initializer whose data does not fit its dims,
an attribute of the wrong kind) raises `OnnxImportError` naming the node.
Before any converter runs, every node of the default domain is held to its op's
schema at the model's opset (_onnx_check.py): input and output counts, required
inputs, known attributes of the declared kinds, and then, as it is converted,
its inputs' dtypes; converters check that a bias or scale cannot broadcast the
result to another shape. protobuf hands back names that are not UTF-8 as bytes:
they are keyed with surrogateescape (so distinct names stay distinct) and shown
with \\xNN in messages, spans and Relay variable names.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from kiln.errors import KilnError
from kiln.ir import graph
from kiln.ir.dtype import DataType
from kiln.ir.module import IRModule
from kiln.ir.span import Span, span_scope
from kiln.ir.types import Dim, SizeVar, TensorType, TupleType
from kiln.registry import Op
from kiln.relay.expr import Call, Constant, Expr, Function, Tuple, TupleGetItem, Var
from kiln.relay.frontend import _onnx_symbolic
from kiln.relay.frontend._onnx_table import (
    ConverterEntry,
    OnnxImportError,
    OnnxUnsupportedError,
    OnnxValueNeededError,
    _domain,
    converters,
    find_converter,
    onnx_converter,
)
from kiln.relay.transform.fold_constant import fold_call, is_constant
from kiln.relay.type_infer import infer_type
from kiln.relay.visitor import ExprMutator, post_order

# ---------------------------------------------------------------------------
# dtypes
# ---------------------------------------------------------------------------

_ONNX_DTYPES = {
    1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64", 9: "bool",
    10: "float16", 11: "float64", 12: "uint32", 13: "uint64", 16: "bfloat16",
}


def onnx_dtype(elem_type: int, what: str) -> DataType:
    """The kiln dtype of ONNX's TensorProto element type `elem_type`; `what` names its owner for the error."""
    name = _ONNX_DTYPES.get(elem_type)
    if name is None:
        import onnx

        try:
            onnx_name = onnx.TensorProto.DataType.Name(elem_type)
        except ValueError:
            onnx_name = f"#{elem_type}"
        raise OnnxImportError(f"{what} has ONNX type {onnx_name}, which kiln does not support")
    return DataType.of(name)


# ---------------------------------------------------------------------------
# What a converter sees
# ---------------------------------------------------------------------------

_REQUIRED: Any = object()


def _key(name: str | bytes) -> str:
    """A name as the importer keys it.

    protobuf hands a string field that is not valid UTF-8 back as bytes; surrogateescape
    decodes those bytes to lone surrogates, which no valid name contains, so two names
    stay distinct exactly when their bytes are.
    """
    return name if isinstance(name, str) else name.decode("utf-8", "surrogateescape")


def _shown(name: str | bytes) -> str:
    """A name as messages, spans and Relay variables show it: undecodable bytes as \\xNN."""
    return _key(name).encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _quoted(name: str | bytes) -> str:
    """A name quoted for a message: its repr, or the shown form in quotes when it has undecodable bytes."""
    key, shown = _key(name), _shown(name)
    return repr(key) if key == shown else f"'{shown}'"


class OnnxNode:
    """One ONNX node as its converter sees it: attributes, inputs (Relay expressions), their types and values."""

    def __init__(self, proto: Any, opset: int, inputs: list[Expr | None], importer: _Importer) -> None:
        self.proto = proto
        self.name: str = _shown(proto.name)
        self.op_type: str = _shown(proto.op_type)
        self.domain: str = _domain(_shown(proto.domain))
        self.opset = opset
        self.inputs = inputs
        self.input_names: list[str] = [_key(n) for n in proto.input]
        self.outputs: list[str] = [_key(n) for n in proto.output]
        self._importer = importer
        self.attrs: dict[str, Any] = {_key(a.name): self._attribute(a) for a in proto.attribute}

    def __str__(self) -> str:
        return _label(self.proto)

    def error(self, message: str) -> OnnxImportError:
        """An OnnxImportError whose message names this node (raise it)."""
        return OnnxImportError(f"{self}: {message}")

    def _attribute(self, a: Any) -> Any:
        from onnx import AttributeProto, helper, numpy_helper

        if a.type == AttributeProto.GRAPH:
            return a.g  # a converter imports it with `subgraph`
        if a.type == AttributeProto.GRAPHS:
            raise self.error(f"attribute {a.name!r} holds a list of subgraphs, which no ONNX op kiln converts takes")
        try:
            value = helper.get_attribute_value(a)
        except Exception as err:
            raise self.error(f"attribute {a.name!r} cannot be read: {err}") from None
        if isinstance(value, bytes):
            return value.decode("utf-8", "replace")
        if a.type == AttributeProto.TENSOR:
            return self._importer.tensor(value, f"attribute {a.name!r} of {self}")
        if isinstance(value, list):
            return [v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in value]
        if a.type == AttributeProto.TENSORS:
            return [numpy_helper.to_array(t) for t in value]
        return value

    # -- attributes -------------------------------------------------------------------

    def attr(self, name: str, default: Any = _REQUIRED) -> Any:
        """The attribute `name`, or `default`; a missing attribute without a default is an error."""
        if name in self.attrs:
            return self.attrs[name]
        if default is _REQUIRED:
            raise self.error(f"the required attribute {name!r} is missing")
        return default

    def int_attr(self, name: str, default: Any = _REQUIRED) -> int:
        value = self.attr(name, default)
        if not isinstance(value, int | np.integer):
            raise self.error(f"attribute {name!r} must be an int, found {value!r}")
        return int(value)

    def bool_attr(self, name: str, default: bool) -> bool:
        """A flag attribute: 0 or 1 (ONNX stores flags as ints; runtimes read other values differently)."""
        value = self.int_attr(name, int(default))
        if value not in (0, 1):
            raise self.error(f"attribute {name!r} is {value}: expected 0 or 1")
        return bool(value)

    def float_attr(self, name: str, default: Any = _REQUIRED) -> float:
        value = self.attr(name, default)
        if not isinstance(value, float | int | np.floating | np.integer):
            raise self.error(f"attribute {name!r} must be a float, found {value!r}")
        return float(value)

    def ints_attr(self, name: str, default: Any = _REQUIRED) -> list[int] | None:
        value = self.attr(name, default)
        if value is None:
            return None
        if not isinstance(value, list | tuple) or not all(isinstance(v, int | np.integer) for v in value):
            raise self.error(f"attribute {name!r} must be a list of ints, found {value!r}")
        return [int(v) for v in value]

    def subgraph(self, name: str, inputs: Sequence[Expr]) -> list[Expr]:
        """The outputs of the subgraph in attribute `name` (an If branch, a Loop body), imported inline.

        Its graph inputs take the expressions `inputs`, in order; its nodes also read the names of
        the graphs around it. Importing a body once per iteration unrolls a loop.
        """
        graph = self.attr(name)
        if not hasattr(graph, "node"):
            raise self.error(f"attribute {name!r} must hold a graph")
        if len(graph.input) != len(inputs):
            raise self.error(f"the subgraph {name!r} takes {len(graph.input)} inputs, given {len(inputs)}")
        return self._importer.import_subgraph(graph, inputs, f"the subgraph {name!r} of {self}")

    # -- inputs -----------------------------------------------------------------------

    def input(self, i: int, what: str | None = None) -> Expr:
        """Input `i`; an error naming it when the node does not give it."""
        e = self.optional_input(i)
        if e is None:
            raise self.error(f"input #{i}{f' ({what})' if what else ''} is required but missing")
        return e

    def optional_input(self, i: int) -> Expr | None:
        """Input `i`, or None when the node leaves it out (absent, or named "")."""
        return self.inputs[i] if i < len(self.inputs) else None

    def type(self, e: Expr | int) -> TensorType:
        """The tensor type of input `e` (an index) or of an expression the converter built."""
        expr = self.input(e) if isinstance(e, int) else e
        t = self._importer.typed(expr, self).checked_type
        if not isinstance(t, TensorType):
            raise self.error(f"expected a tensor, found {t}")
        return t

    def shape(self, e: Expr | int) -> tuple[Dim, ...]:
        return self.type(e).shape

    def ndim(self, e: Expr | int) -> int:
        return len(self.type(e).shape)

    def dtype(self, e: Expr | int) -> DataType:
        return self.type(e).dtype

    def static_shape(self, e: Expr | int, what: str = "input") -> tuple[int, ...]:
        """The shape of `e` as ints; an error when a dim is symbolic."""
        shape = self.shape(e)
        if not all(isinstance(d, int) for d in shape):
            raise self.error(f"{what} has the symbolic shape {tuple(str(d) for d in shape)}; give static shapes")
        return tuple(int(d) for d in shape)  # type: ignore[arg-type]

    def check_broadcasts_to(self, e: Expr | int, target: Sequence[Dim], what: str) -> None:
        """An error unless `e` broadcasts to `target` unchanged (ONNX's unidirectional broadcasting).

        A bias or a scale that broadcast both ways would silently change the shape of the result.
        """
        shape = self.shape(e)
        fits = len(shape) <= len(target) and all(
            d == 1 or d == t for d, t in zip(reversed(shape), reversed(target), strict=False))
        if not fits:
            raise self.error(f"{what} has shape {_dims(shape)}, which does not broadcast to {_dims(target)}")

    def value(self, e: Expr | int, what: str = "") -> np.ndarray:
        """The value of input `e` (an index or expression), which must be a constant or an initializer."""
        expr = self.input(e, what) if isinstance(e, int) else e
        value = self.const_value(expr)
        if value is None:
            index = e if isinstance(e, int) else next((i for i, x in enumerate(self.inputs) if x is e), None)
            label = f"input #{index}" if index is not None else "a value"
            label += f" ({what})" if what else ""
            behind = self._importer.graph_inputs_behind(expr)
            if behind:
                shown = ", ".join(repr(n) for n in behind)
                raise OnnxValueNeededError(
                    f"{self}: {label} decides a shape and is computed from the graph input(s) {shown} at run "
                    f"time; run the model with relay.frontend.OnnxRunner, which compiles once per distinct "
                    f"value of {shown}, or fix it with from_onnx(model, values={{...}})", behind)
            raise self.error(
                f"{label} must be a constant (an initializer or computed from "
                "constants and static shapes); kiln compiles static shapes"
            )
        return value

    def scalar(self, i: int, what: str) -> Any:
        """The one element of input `i`'s value (a scalar or a one-element tensor), as a numpy scalar."""
        value = self.value(i, what)
        if value.size != 1:
            raise self.error(f"input #{i} ({what}) must hold one element, found shape {value.shape}")
        return value.reshape(-1)[0]

    def symbolic_value(self, i: int) -> np.ndarray | None:
        """The value of input `i` when it is computed from symbolic shapes (an object array of ints and
        `SymDim`s, `_onnx_symbolic`), else None."""
        e = self.optional_input(i)
        return None if e is None else self._importer.symbolic.get(id(e))

    def set_symbolic(self, e: Expr, value: np.ndarray) -> None:
        """Records that `e`, which computes a shape at run time, has this value of symbolic dims."""
        self._importer.symbolic[id(e)] = np.asarray(value, dtype=object)

    def const_value(self, e: Expr | None) -> np.ndarray | None:
        """The value of `e` when it is a constant or a parameter's initializer, else None."""
        if e is None:
            return None
        if isinstance(e, Constant):
            return np.asarray(e.data)
        if isinstance(e, Var):
            return self._importer.param_values.get(id(e))
        return None


# ---------------------------------------------------------------------------
# Eager folding and typing
# ---------------------------------------------------------------------------


class _EagerFolder(ExprMutator):
    """Folds what a converter built: calls whose arguments are all constants, bottom up.

    `done` holds every node of the results converted so far (folded already):
    they are not walked again. (Whether a node is typed says nothing: a
    converter types what it builds when it asks for a shape.)
    """

    def __init__(self, done: dict[int, Expr]) -> None:
        super().__init__()
        self.done = done

    def visit(self, root: Expr) -> Expr:
        memo, done = self.memo, self.done
        for node in post_order(root, lambda n: id(n) in done):
            if id(node) not in memo:
                memo[id(node)] = node if id(node) in done else self._rewrite(node)
        result = memo[id(root)]
        for node in post_order(result, lambda n: id(n) in done):
            done[id(node)] = node  # (holding the node keeps its id from being reused)
        return result

    def rewrite_call(self, node: Call, op: Op | Expr, args: tuple[Expr, ...]) -> Expr:
        new = super().rewrite_call(node, op, args)
        if not isinstance(new, Call) or not all(is_constant(a) for a in args):
            return new
        infer_type(new, reuse=True)
        folded = fold_call(new, args)
        return folded if folded is not None else new

    def rewrite_tuple_getitem(self, node: TupleGetItem, value: Expr) -> Expr:
        if isinstance(value, Tuple):
            return value.fields[node.index]
        return super().rewrite_tuple_getitem(node, value)


# ---------------------------------------------------------------------------
# The importer
# ---------------------------------------------------------------------------


class _Importer:
    def __init__(
        self, model: Any, shape: Mapping[str, Sequence[Any]], dtype: Any, freeze_params: bool,
        values: Mapping[str, Any],
    ) -> None:
        self.model = model
        self.fixed = dict(values)
        self.folded: dict[int, Expr] = {}  # the nodes of converted results (see _EagerFolder)
        self.symbolic: dict[int, np.ndarray] = {}  # id(expr) -> its value, of symbolic dims (_onnx_symbolic)
        self.graph = model.graph
        self.shape_override = dict(shape)
        self.dtype_override = dtype
        self.freeze = freeze_params
        self.opsets: dict[str, int] = {}
        for imp in model.opset_import:
            self.opsets[_domain(_shown(imp.domain))] = int(imp.version)
        self.values: dict[str, Expr] = {}
        self.params: dict[str, np.ndarray] = {}
        self.param_values: dict[int, np.ndarray] = {}
        self.param_vars: list[Var] = []
        self.inputs: list[Var] = []

    # -- helpers ----------------------------------------------------------------------

    def tensor(self, proto: Any, what: str) -> np.ndarray:
        from onnx import numpy_helper

        onnx_dtype(proto.data_type, what)
        try:
            array = numpy_helper.to_array(proto)
        except Exception as err:
            dims = tuple(proto.dims)
            raise OnnxImportError(f"{what}: its data does not fit its dims {dims}: {err}") from None
        expected = int(np.prod(proto.dims)) if len(proto.dims) else 1
        if array.size != expected:
            raise OnnxImportError(f"{what}: its data holds {array.size} elements but its dims {tuple(proto.dims)} "
                                  f"need {expected}")
        return np.array(array, order="C")  # (ascontiguousarray would make a 0-d array 1-d)

    def typed(self, expr: Expr, node: OnnxNode | None) -> Expr:
        from kiln.relay.type_infer import TypeInferenceError

        if not expr.has_type:
            try:
                infer_type(expr, reuse=True)
            except TypeInferenceError as err:
                where = f"{node}: " if node is not None else ""
                raise OnnxImportError(f"{where}{err}") from None
        return expr

    # -- the graph --------------------------------------------------------------------

    def import_graph(self) -> tuple[IRModule, dict[str, np.ndarray]]:
        graph = self.graph
        init_names = set()
        for index, init in enumerate(graph.initializer):
            key, shown = _key(init.name), _shown(init.name)
            if not key:
                raise OnnxImportError(f"initializer #{index} has no name")
            if key in init_names:
                raise OnnxImportError(f"initializer {_quoted(init.name)} is defined twice")
            init_names.add(key)
            array = self.tensor(init, f"initializer {_quoted(init.name)}")
            with span_scope(Span(shown)):
                if self.freeze:
                    self.values[key] = Constant(array, span=Span(shown))
                else:
                    v = Var(shown, TensorType(array.shape, DataType.of(array.dtype)), span=Span(shown))
                    self.values[key] = v
                    self.params[shown] = array
                    self.param_values[id(v)] = array
                    self.param_vars.append(v)
        graph_inputs = [i for i in graph.input if _key(i.name) not in init_names]
        keys: dict[str, str] = {}  # shown name -> key
        for index, value_info in enumerate(graph.input):
            key, shown = _key(value_info.name), _shown(value_info.name)
            if key in init_names:
                continue
            if not key:
                raise OnnxImportError(f"graph input #{index} has no name")
            if keys.get(shown) == key:
                raise OnnxImportError(f"graph input {_quoted(value_info.name)} is declared twice")
            if shown in keys:
                raise _shown_alike([shown])
            keys[shown] = key
        names = set(keys)
        shown_params = [v.name_hint for v in self.param_vars]
        clash = names & set(shown_params) or {n for n, count in Counter(shown_params).items() if count > 1}
        if clash:
            raise _shown_alike(sorted(clash))
        for option, given in (("shape", self.shape_override), ("values", self.fixed)):
            unknown = sorted(set(given) - names)
            if unknown:
                raise OnnxImportError(f"{option}= names {unknown}, which are not inputs of the model; "
                                      f"its inputs are {sorted(names)}")
        for value_info in graph_inputs:
            v = self.input_var(value_info)
            if v.name_hint in self.fixed:
                self.values[_key(value_info.name)] = self.fixed_value(v)
            else:
                self.inputs.append(v)
                self.values[_key(value_info.name)] = v
        nodes = self.sorted_nodes(list(self.graph.node), set(self.values))
        self.check_supported(nodes)
        for node in nodes:
            self.convert(node)
        outputs = []
        for index, out in enumerate(graph.output):
            if not _key(out.name):
                raise OnnxImportError(f"graph output #{index} has no name")
            if _key(out.name) not in self.values:
                raise OnnxImportError(f"graph output {_quoted(out.name)} is not produced by any node, input or "
                                      "initializer")
            outputs.append(self.check_output(out, self.values[_key(out.name)]))
        if not outputs:
            raise OnnxImportError("the graph has no outputs")
        body = outputs[0] if len(outputs) == 1 else Tuple(tuple(outputs))
        # the graph's output names, which relay.build gives the library's outputs (`kiln run` prints them)
        func = Function((*self.inputs, *self.param_vars), body,
                        attrs={"output_names": tuple(out.name for out in graph.output)})
        infer_type(func)
        return IRModule.from_expr(func), self.params

    def fixed_value(self, v: Var) -> Constant:
        """The value given for input `v` through `values=`, once it fits the type the model declares."""
        array = np.asarray(self.fixed[v.name_hint])
        t = v.type_annotation
        assert isinstance(t, TensorType)
        fits = array.ndim == len(t.shape) and all(not isinstance(d, int) or d == n for d, n in zip(
            t.shape, array.shape, strict=True))
        if DataType.of(array.dtype) != t.dtype or not fits:
            raise OnnxImportError(f"values= gives input {v.name_hint!r} a {array.dtype} array of shape "
                                  f"{array.shape}; the model declares {t}")
        return Constant(np.array(array, order="C"), span=Span(v.name_hint))

    def graph_inputs_behind(self, expr: Expr) -> list[str]:
        """The names of the graph inputs that `expr` is computed from (free variables that are inputs)."""
        from kiln.relay.analysis import free_vars

        inputs = {id(v) for v in self.inputs}
        return [v.name_hint for v in free_vars(expr) if id(v) in inputs]

    def check_output(self, value_info: Any, expr: Expr) -> Expr:
        """`expr`, once its dtype agrees with what the model declares for the graph output `value_info`.

        A declared dtype that the graph does not compute is an error (onnxruntime refuses it too); a
        declared shape is not checked: onnxruntime warns and runs the graph, as kiln does.
        """
        t = expr.checked_type
        declared = value_info.type.tensor_type if value_info.type.HasField("tensor_type") else None
        if declared is None or not isinstance(t, TensorType) or not declared.elem_type:
            return expr
        what = f"graph output {_quoted(value_info.name)}"
        if onnx_dtype(declared.elem_type, what) != t.dtype:
            raise OnnxImportError(f"{what} is declared {onnx_dtype(declared.elem_type, what)} but the graph "
                                  f"computes {t}")
        return expr

    def input_var(self, value_info: Any) -> Var:
        name = _shown(value_info.name)
        tensor_type = value_info.type.tensor_type if value_info.type.HasField("tensor_type") else None
        if tensor_type is None:
            raise OnnxImportError(f"input {name!r} is not a tensor; kiln imports tensor inputs only")
        override = self.dtype_override
        if isinstance(override, Mapping):
            override = override.get(name)
        dtype = DataType.of(override) if override is not None else onnx_dtype(tensor_type.elem_type, f"input {name!r}")
        if name in self.shape_override:
            shape: tuple[Dim, ...] = tuple(_override_dim(name, d) for d in self.shape_override[name])
            declared = tensor_type.shape.dim if tensor_type.HasField("shape") else None
            if declared is not None and len(declared) != len(shape):
                raise OnnxImportError(f"shape= gives input {name!r} rank {len(shape)}, but the model declares "
                                      f"rank {len(declared)}")
        elif not tensor_type.HasField("shape"):
            raise OnnxImportError(f"input {name!r} has no shape; give it with shape={{{name!r}: (...)}}")
        else:
            dims: list[Dim] = []
            for axis, d in enumerate(tensor_type.shape.dim):
                if d.HasField("dim_value") and d.dim_value >= 0:
                    dims.append(int(d.dim_value))
                else:
                    dims.append(SizeVar(d.dim_param if d.dim_param else f"{name}_{axis}"))
            shape = tuple(dims)
        return Var(name, TensorType(shape, dtype), span=Span(name))

    def import_subgraph(self, graph: Any, inputs: Sequence[Expr], what: str) -> list[Expr]:
        """The outputs of `graph` (a subgraph) with its inputs bound to `inputs`, converted in this scope."""
        outer = self.values
        self.values = dict(outer)
        try:
            for vi, e in zip(graph.input, inputs, strict=True):
                self.values[_key(vi.name)] = e
            for init in graph.initializer:
                shown = _shown(init.name)
                self.values[_key(init.name)] = Constant(self.tensor(init, f"initializer {shown!r} of {what}"),
                                                        span=Span(shown))
            nodes = self.sorted_nodes(list(graph.node), set(self.values))
            self.check_supported(nodes)
            for node in nodes:
                self.convert(node)
            missing = [_shown(o.name) for o in graph.output if _key(o.name) not in self.values]
            if missing:
                raise OnnxImportError(f"{what}: output(s) {missing} are not produced by any node or input")
            return [self.values[_key(o.name)] for o in graph.output]
        finally:
            self.values = outer

    def sorted_nodes(self, nodes: list[Any], defined: set[str]) -> list[Any]:
        """The nodes in an order where each reads only names defined before it; errors for dangling names."""
        producer: dict[str, int] = {}
        for i, node in enumerate(nodes):
            for out in map(_key, node.output):
                if not out:
                    continue
                if out in producer or out in defined:
                    raise OnnxImportError(f"{_label(node, i)}: output {_quoted(out)} is also defined elsewhere "
                                          "in the graph")
                producer[out] = i
        deps: list[set[int]] = []
        for i, node in enumerate(nodes):
            need = set()
            for name in map(_key, node.input):
                if not name or name in defined:
                    continue
                if name not in producer:
                    raise OnnxImportError(
                        f"{_label(node, i)} reads {_quoted(name)}, which no node, graph input or initializer defines"
                    )
                need.add(producer[name])
            deps.append(need)
        order = graph.post_order(range(len(nodes)), lambda i: sorted(deps[i]), key=lambda i: i,
                                 on_cycle=lambda j: OnnxImportError(f"the graph has a cycle through "
                                                                    f"{_label(nodes[j], j)}"))
        return [nodes[i] for i in order]

    def check_supported(self, nodes: list[Any]) -> None:
        missing: dict[tuple[str, str, int], list[str]] = {}
        for i, node in enumerate(nodes):
            domain = _domain(_shown(node.domain))
            opset = self.opsets.get(domain)
            if opset is None:
                raise OnnxImportError(f"{_label(node, i)} uses domain {domain!r}, which the model does not import")
            if find_converter(_shown(node.op_type), opset, domain) is None:
                missing.setdefault((domain, _shown(node.op_type), opset), []).append(_shown(node.name) or f"#{i}")
        if missing:
            raise OnnxUnsupportedError(missing)
        from kiln.relay.frontend._onnx_check import check_node

        for i, node in enumerate(nodes):
            domain = _domain(_shown(node.domain))
            check_node(node, _label(node, i), self.opsets[domain], domain)

    def convert(self, proto: Any) -> None:
        domain = _domain(_shown(proto.domain))
        opset = self.opsets[domain]
        entry = find_converter(_shown(proto.op_type), opset, domain)
        assert entry is not None
        inputs = [self.values[n] if n else None for n in map(_key, proto.input)]
        first = next((_shown(o) for o in proto.output if o), "")
        span = Span(_shown(proto.name) or f"{_shown(proto.op_type)}:{first}")
        from kiln.relay.frontend._onnx_check import check_input_types

        types = [None if e is None else self.typed(e, None).checked_type for e in inputs]
        dtypes = [str(t.dtype) if isinstance(t, TensorType) else None for t in types]
        check_input_types(proto, _label(proto), opset, domain, dtypes)
        with span_scope(span):
            node = OnnxNode(proto, opset, inputs, self)
            try:
                result = entry.fn(node)
            except KilnError as err:
                named = isinstance(err, OnnxImportError) and str(node) in str(err)
                if named or isinstance(err, OnnxValueNeededError):  # (one inside a subgraph names its own node)
                    raise
                raise node.error(str(err)) from None
            except Exception as err:  # a converter tripped over a malformed node: still kiln's error, naming it
                raise node.error(f"cannot be converted ({type(err).__name__}: {err})") from err
            outputs = self.outputs(node, result)
            for name, expr in zip(node.outputs, outputs, strict=False):
                if not name:
                    continue
                if expr is None:
                    raise node.error(f"output {name!r} is not supported by kiln's converter")
                expr = _EagerFolder(self.folded).visit(expr)
                self.values[name] = self.typed(expr, node)
            if len(outputs) == 1 and node.outputs and node.outputs[0]:
                (value,) = _onnx_symbolic.propagate(node, self.symbolic, [self.values[node.outputs[0]]])
                self.values[node.outputs[0]] = self.typed(value, node)

    def outputs(self, node: OnnxNode, result: Any) -> list[Expr | None]:
        if isinstance(result, Expr):
            self.typed(result, node)
            if isinstance(result.checked_type, TupleType) and len(node.outputs) > 1:
                return [TupleGetItem(result, i) for i in range(len(result.checked_type.fields))]
            result = [result]
        outs = list(result)
        used = [n for n in node.outputs[len(outs):] if n]
        if used:
            raise node.error(f"output(s) {used} are not supported by kiln's converter")
        return outs


def _shown_alike(names: list[str]) -> OnnxImportError:
    # Only bytes that are not UTF-8, shown as \xNN, can make two distinct names read the same.
    return OnnxImportError(f"inputs or initializers {names} are distinct names that read the same once their "
                           "bytes that are not UTF-8 are shown as \\xNN; rename them")


def _dims(shape: Sequence[Dim]) -> str:
    return f"({', '.join(map(str, shape))}{',' if len(shape) == 1 else ''})"


def _override_dim(name: str, d: Any) -> Dim:
    if isinstance(d, str) and d.isidentifier():
        return SizeVar(d)
    if isinstance(d, int | np.integer) and not isinstance(d, bool) and d >= 0:
        return int(d)
    raise OnnxImportError(f"shape= for input {name!r}: dim {d!r} is neither a size nor a name (identifier)")


def _label(node: Any, index: int | None = None) -> str:
    """How errors name a node: its name, else its first output, else its position."""
    op_type = _shown(node.op_type)
    if node.name:
        return f"{op_type} node {_quoted(node.name)}"
    if any(node.output):
        return f"{op_type} node (output {_quoted(next(o for o in node.output if o))})"
    return f"{op_type} node #{index}"


def load_model(model_or_path: Any) -> Any:
    """An onnx.ModelProto from a path, bytes or a ModelProto; OnnxImportError for what onnx cannot read."""
    try:
        import onnx
    except ImportError:
        raise OnnxImportError("importing ONNX models needs the onnx package: pip install 'kiln[onnx]'") from None
    if isinstance(model_or_path, onnx.ModelProto):
        return model_or_path
    try:
        if isinstance(model_or_path, bytes):
            return onnx.load_from_string(model_or_path)
        if isinstance(model_or_path, str | os.PathLike):
            return onnx.load(os.fspath(model_or_path))
    except OSError as err:
        raise OnnxImportError(f"cannot read the ONNX model: {err.strerror or err}: {str(model_or_path)!r}") from None
    except Exception as err:
        raise OnnxImportError(f"{str(model_or_path)!r} is not a readable ONNX model: {err}") from None
    found = type(model_or_path).__name__
    raise OnnxImportError(f"from_onnx expects a path, bytes or an onnx.ModelProto, found {found}")


def from_onnx(
    model_or_path: Any,
    shape: Mapping[str, Sequence[Any]] | None = None,
    dtype: Any = None,
    freeze_params: bool = True,
    values: Mapping[str, Any] | None = None,
) -> tuple[IRModule, dict[str, np.ndarray]]:
    """Converts an ONNX model to a Relay module and its parameters.

    Args:
        model_or_path: an `onnx.ModelProto`, the path of a .onnx file, or its bytes.
        shape: input name → shape, overriding the model's (a str dim is symbolic).
            Dims the model leaves symbolic become Relay size variables.
        dtype: the input dtype (a name), or input name → dtype; default: the model's.
        freeze_params: initializers become constants (True) or parameters of main whose
            values are returned in `params` (False).
        values: input name → array: those inputs become constants holding these values (they
            must fit the model's declared dtype and shape), so the values that decide shapes
            (a Reshape's shape, TopK's k, ...) may be computed from them. `OnnxRunner` passes
            them at run time.

    Returns:
        (mod, params): the typed module, and the initializers that are parameters.

    Raises:
        OnnxUnsupportedError: ops without a converter, all listed with the nodes that use them.
        OnnxValueNeededError: a value that decides a shape is computed from graph inputs not in
            `values`; its `names` lists them.
        OnnxImportError: a malformed model or a node that cannot be converted, naming the node.
    """
    model = load_model(model_or_path)
    if not model.HasField("graph"):
        raise OnnxImportError("the model has no graph")
    return _Importer(model, shape or {}, dtype, freeze_params, values or {}).import_graph()


__all__ = [
    "ConverterEntry",
    "OnnxImportError",
    "OnnxNode",
    "OnnxUnsupportedError",
    "OnnxValueNeededError",
    "converters",
    "find_converter",
    "from_onnx",
    "onnx_converter",
]
