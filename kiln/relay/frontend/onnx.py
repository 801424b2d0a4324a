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

import inspect
import os
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import numpy as np

from kiln.errors import KilnError
from kiln.ir import graph
from kiln.ir.dtype import DataType
from kiln.ir.module import IRModule
from kiln.ir.span import Span, span_scope
from kiln.ir.types import Dim, SizeVar, TensorType, TupleType
from kiln.registry import Op
from kiln.relay.expr import Call, Constant, Expr, Function, Tuple, TupleGetItem, Var
from kiln.relay.transform.fold_constant import fold_call, is_constant
from kiln.relay.type_infer import infer_type
from kiln.relay.visitor import ExprMutator, post_order


class OnnxImportError(KilnError, ValueError):
    """The ONNX model is malformed, or a node cannot be converted; the message names the node."""


class OnnxUnsupportedError(OnnxImportError):
    """The model uses ops (or opsets) that no converter handles; `unsupported` lists them all."""

    def __init__(self, unsupported: Mapping[tuple[str, str, int], list[str]]) -> None:
        self.unsupported = dict(unsupported)
        lines = []
        for (domain, op_type, opset), names in sorted(self.unsupported.items()):
            shown = ", ".join(repr(n) for n in names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
            qualified = f"{domain}.{op_type}" if domain else op_type
            lines.append(f"  {qualified} (opset {opset}): {shown}{_known_versions(domain, op_type)}")
        super().__init__(f"the model uses {len(lines)} op(s) kiln cannot convert:\n" + "\n".join(lines))


# ---------------------------------------------------------------------------
# The converter table
# ---------------------------------------------------------------------------

Converter = Callable[["OnnxNode"], "Expr | Sequence[Expr | None]"]


@attrs.frozen
class ConverterEntry:
    """One converter: it handles `op_type` of `domain` from opset `since` up to `until` (inclusive)."""

    domain: str
    op_type: str
    since: int
    until: int | None
    fn: Converter
    where: str

    def handles(self, opset: int) -> bool:
        return self.since <= opset and (self.until is None or opset <= self.until)


_TABLE: dict[tuple[str, str], list[ConverterEntry]] = {}
_LOCK = threading.Lock()


def _domain(domain: str) -> str:
    return "" if domain in ("", "ai.onnx") else domain


def onnx_converter(
    op_type: str, domain: str = "", since: int = 1, until: int | None = None, override: bool = False
) -> Callable[[Converter], Converter]:
    """Registers the decorated function as the converter of `op_type` for opsets `since`..`until`.

    The model's opset import for `domain` picks the entry: the one with the
    highest `since` not above it (and not past its `until`). Registering the
    same (domain, op_type, since) twice is an error naming both places, unless
    `override` is true (a user replacing kiln's own converter).
    """
    if since < 1 or (until is not None and until < since):
        raise OnnxImportError(f"converter of {op_type}: bad opset range since={since} until={until}")

    def register(fn: Converter) -> Converter:
        where = _where(fn)
        entry = ConverterEntry(_domain(domain), op_type, since, until, fn, where)
        with _LOCK:
            entries = _TABLE.setdefault((entry.domain, op_type), [])
            for i, old in enumerate(entries):
                if old.since == since:
                    if not override:
                        raise OnnxImportError(
                            f"a converter of {op_type} (domain {domain!r}) since opset {since} is registered twice: "
                            f"{old.where} and {where}; pass override=True to replace it"
                        )
                    del entries[i]
                    break
            entries.append(entry)
            entries.sort(key=lambda e: e.since)
        return fn

    return register


def _where(fn: Callable[..., Any]) -> str:
    """file:line of `fn`, kiln's own files relative to the repository."""
    try:
        path, line = inspect.getsourcefile(fn) or "?", inspect.getsourcelines(fn)[1]
    except (OSError, TypeError):
        return getattr(fn, "__qualname__", repr(fn))
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    if os.path.abspath(path).startswith(root + os.sep):
        path = os.path.relpath(path, root)
    return f"{path}:{line}"


def find_converter(op_type: str, opset: int, domain: str = "") -> ConverterEntry | None:
    """The converter of `op_type` for `opset`, or None."""
    _load_builtin()
    with _LOCK:
        entries = list(_TABLE.get((_domain(domain), op_type), ()))
    best = None
    for entry in entries:
        if entry.since <= opset:
            best = entry
    return best if best is not None and best.handles(opset) else None


def converters() -> list[ConverterEntry]:
    """Every registered converter, by domain, op type and opset (`kiln ops --onnx` prints them)."""
    _load_builtin()
    with _LOCK:
        return sorted((e for es in _TABLE.values() for e in es), key=lambda e: (e.domain, e.op_type, e.since))


def _known_versions(domain: str, op_type: str) -> str:
    entries = _TABLE.get((_domain(domain), op_type))
    if not entries:
        return ""
    ranges = ", ".join(f"{e.since}-{e.until}" if e.until else f"{e.since}+" for e in entries)
    return f" (kiln converts opsets {ranges})"


_BUILTIN_LOADED = False


def _load_builtin() -> None:
    global _BUILTIN_LOADED
    if not _BUILTIN_LOADED:
        _BUILTIN_LOADED = True
        from kiln.relay.frontend import _onnx_math, _onnx_nn, _onnx_tensor  # noqa: F401  (they register)


# ---------------------------------------------------------------------------
# dtypes
# ---------------------------------------------------------------------------

_ONNX_DTYPES = {
    1: "float32", 2: "uint8", 3: "int8", 5: "int16", 6: "int32", 7: "int64", 9: "bool",
    10: "float16", 11: "float64", 16: "bfloat16",
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

        if a.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS):
            raise self.error(f"attribute {a.name!r} holds a subgraph; kiln does not import control flow")
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
            raise self.error(
                f"{label}{f' ({what})' if what else ''} must be a constant (an initializer or computed from "
                "constants and static shapes); kiln compiles static shapes"
            )
        return value

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
    """Folds the new (untyped) part of an expression: calls whose arguments are all constants."""

    def visit(self, root: Expr) -> Expr:
        memo = self.memo
        for node in post_order(root, _typed):
            if id(node) not in memo:
                memo[id(node)] = node if node.has_type and node is not root else self._rewrite(node)
        return memo[id(root)]

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


def _typed(node: Expr) -> bool:
    return node.has_type


# ---------------------------------------------------------------------------
# The importer
# ---------------------------------------------------------------------------


class _Importer:
    def __init__(self, model: Any, shape: Mapping[str, Sequence[Any]], dtype: Any, freeze_params: bool) -> None:
        self.model = model
        self.graph = model.graph
        self.shape_override = dict(shape)
        self.dtype_override = dtype
        self.freeze = freeze_params
        self.opsets: dict[str, int] = {}
        for imp in model.opset_import:
            self.opsets[_domain(_shown(imp.domain))] = int(imp.version)
        if "" not in self.opsets:
            raise OnnxImportError("the model imports no version of the default ONNX opset (opset_import is empty)")
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
        unknown = sorted(set(self.shape_override) - names)
        if unknown:
            raise OnnxImportError(f"shape= names {unknown}, which are not inputs of the model; "
                                  f"its inputs are {sorted(names)}")
        for value_info in graph_inputs:
            v = self.input_var(value_info)
            self.inputs.append(v)
            self.values[_key(value_info.name)] = v
        nodes = self.sorted_nodes(set(self.values))
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
        func = Function((*self.inputs, *self.param_vars), body)
        infer_type(func)
        return IRModule.from_expr(func), self.params

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

    def sorted_nodes(self, defined: set[str]) -> list[Any]:
        """The nodes in an order where each reads only names defined before it; errors for dangling names."""
        producer: dict[str, int] = {}
        nodes = list(self.graph.node)
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
                if isinstance(err, OnnxImportError) and str(node) in str(err):
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
                expr = _EagerFolder().visit(expr)
                self.values[name] = self.typed(expr, node)

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
) -> tuple[IRModule, dict[str, np.ndarray]]:
    """Converts an ONNX model to a Relay module and its parameters.

    Args:
        model_or_path: an `onnx.ModelProto`, the path of a .onnx file, or its bytes.
        shape: input name → shape, overriding the model's (a str dim is symbolic).
            Dims the model leaves symbolic become Relay size variables.
        dtype: the input dtype (a name), or input name → dtype; default: the model's.
        freeze_params: initializers become constants (True) or parameters of main whose
            values are returned in `params` (False).

    Returns:
        (mod, params): the typed module, and the initializers that are parameters.

    Raises:
        OnnxUnsupportedError: ops without a converter, all listed with the nodes that use them.
        OnnxImportError: a malformed model or a node that cannot be converted, naming the node.
    """
    model = load_model(model_or_path)
    if not model.HasField("graph"):
        raise OnnxImportError("the model has no graph")
    return _Importer(model, shape or {}, dtype, freeze_params).import_graph()


__all__ = [
    "ConverterEntry",
    "OnnxImportError",
    "OnnxNode",
    "OnnxUnsupportedError",
    "converters",
    "find_converter",
    "from_onnx",
    "onnx_converter",
]
