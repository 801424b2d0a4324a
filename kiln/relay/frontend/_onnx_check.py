"""Checks of each ONNX node against its operator schema, before any converter runs.

A converter reads the inputs and attributes it knows and would silently ignore
the rest, so the importer first holds every node of the default domain up to
the schema of its op at the model's opset (`onnx.defs.get_schema`): no more
inputs or outputs than the schema allows, every required input given and not
left empty (optional inputs may be named ""), no attribute the op does not
define, each attribute of the kind the schema declares, every required
attribute present. Ops without a schema (custom domains) are left to their
converters.
"""

from __future__ import annotations

import functools
from typing import Any

from kiln.relay.frontend.onnx import OnnxImportError, _key


@functools.lru_cache(maxsize=1024)
def _schema(op_type: str, opset: int, domain: str) -> Any:
    """The schema of `op_type` in force at `opset`, or None when onnx defines none (or it is deprecated)."""
    import onnx.defs

    try:
        schema = onnx.defs.get_schema(op_type, opset, domain)
    except onnx.defs.SchemaError:
        return None
    return None if schema.deprecated else schema


@functools.cache
def _first_opsets() -> dict[tuple[str, str], int]:
    """(domain, op_type) -> the opset that first defines the op."""
    import onnx.defs

    first: dict[tuple[str, str], int] = {}
    for s in onnx.defs.get_all_schemas_with_history():
        key = ("" if s.domain == "ai.onnx" else s.domain, s.name)
        first[key] = min(first.get(key, s.since_version), s.since_version)
    return first


def _kind(attr_type: int) -> str:
    from onnx import AttributeProto

    try:
        return str(AttributeProto.AttributeType.Name(attr_type))
    except ValueError:
        return f"#{attr_type}"


def _formal(index: int, params: Any) -> Any:
    """The formal parameter at `index`: the last one when it is variadic and `index` is past it."""
    return params[min(index, len(params) - 1)] if params else None


def check_node(proto: Any, label: str, opset: int, domain: str) -> None:
    """Raises OnnxImportError, naming the node as `label`, when `proto` breaks its op's schema at `opset`."""
    import onnx.defs

    op_type = _key(proto.op_type)
    schema = _schema(op_type, opset, domain)
    if schema is None:
        # an op that ONNX defines only from a later opset (Erf at opset 7) is an error, though kiln's converter
        # (registered from opset 1) would take it; an op ONNX does not define is left to its converter
        first = _first_opsets().get((domain, op_type))
        if first is not None and first > opset:
            raise OnnxImportError(f"{label}: {op_type} exists from opset {first}, but the model imports opset "
                                  f"{opset}")
        return
    where = f"{label} (opset {opset})"
    single = onnx.defs.OpSchema.FormalParameterOption.Single
    variadic = onnx.defs.OpSchema.FormalParameterOption.Variadic
    inputs = [_key(n) for n in proto.input]
    names = ", ".join(p.name for p in schema.inputs) or "none"
    if len(inputs) > schema.max_input:  # a trailing "" counts, as onnxruntime counts it
        raise OnnxImportError(f"{where} takes at most {schema.max_input} input(s) ({names}), found "
                              f"{len(inputs)}: {inputs}")
    while inputs and not inputs[-1]:  # trailing "" leave optional inputs out, as if they were not listed
        inputs.pop()
    for i, param in enumerate(schema.inputs):
        if param.option == single and (i >= len(inputs) or not inputs[i]):
            raise OnnxImportError(f"{where}: input #{i} ({param.name}) is required but "
                                  + ("missing" if i >= len(inputs) else 'given as ""'))
    for i, name in enumerate(inputs):
        param = _formal(i, schema.inputs)
        if not name and param is not None and param.option == variadic:
            raise OnnxImportError(f"{where}: input #{i} (one of the variadic {param.name}) is given as " + '""')
    if len(inputs) < schema.min_input:
        raise OnnxImportError(f"{where} needs at least {schema.min_input} input(s) ({names}), found {len(inputs)}")
    outputs = len(proto.output)
    if not schema.min_output <= outputs <= schema.max_output:
        allowed = (f"{schema.min_output}" if schema.min_output == schema.max_output
                   else f"{schema.min_output} to {schema.max_output}")
        raise OnnxImportError(f"{where} has {allowed} output(s) "
                              f"({', '.join(p.name for p in schema.outputs)}), found {outputs}")
    seen: set[str] = set()
    for attr in proto.attribute:
        name = _key(attr.name)
        if name in seen:
            raise OnnxImportError(f"{where}: attribute {name!r} is given twice")
        seen.add(name)
        declared = schema.attributes.get(name)
        if declared is None:
            known = ", ".join(sorted(schema.attributes)) or "none"
            raise OnnxImportError(f"{where} has no attribute {name!r} (its attributes: {known})")
        if attr.ref_attr_name:
            raise OnnxImportError(f"{where}: attribute {name!r} refers to the function attribute "
                                  f"{_key(attr.ref_attr_name)!r}, which a graph cannot bind")
        expected = int(declared.type)
        if attr.type != expected:
            raise OnnxImportError(f"{where}: attribute {name!r} must be {_kind(expected)}, "
                                  f"found {_kind(attr.type)}")
    missing = sorted(n for n, a in schema.attributes.items() if a.required and n not in seen)
    if missing:
        raise OnnxImportError(f"{where}: the required attribute(s) {missing} are missing")


# kiln's dtype names as ONNX's type strings
_TYPE_STRS = {"float32": "tensor(float)", "float64": "tensor(double)", "float16": "tensor(float16)",
              "bfloat16": "tensor(bfloat16)", "int8": "tensor(int8)", "int16": "tensor(int16)",
              "int32": "tensor(int32)", "int64": "tensor(int64)", "uint8": "tensor(uint8)", "bool": "tensor(bool)"}


def check_input_types(proto: Any, label: str, opset: int, domain: str, dtypes: list[str | None]) -> None:
    """Raises OnnxImportError when an input's dtype (None: absent) breaks the op's type constraints.

    A converter would otherwise compute something for a dtype the op does not define (HardSigmoid of
    int64 rounded its alpha to 0), and inputs bound to one type variable must share a dtype.
    """
    schema = _schema(_key(proto.op_type), opset, domain)
    if schema is None or not schema.inputs:
        return
    allowed = {c.type_param_str: set(c.allowed_type_strs) for c in schema.type_constraints}
    bound: dict[str, tuple[int, str]] = {}
    for i, dtype in enumerate(dtypes):
        param = _formal(i, schema.inputs)
        if dtype is None or param is None:
            continue
        type_str = _TYPE_STRS.get(dtype)
        if type_str is None:
            continue
        variable = param.type_str
        permitted = allowed.get(variable, {variable})
        if type_str not in permitted:
            shown = ", ".join(sorted(t[7:-1] for t in permitted if t.startswith("tensor(")))
            raise OnnxImportError(f"{label} (opset {opset}): input #{i} ({param.name}) is {type_str[7:-1]}, "
                                  f"which {_key(proto.op_type)} does not take (it takes {shown})")
        if variable in allowed and param.is_homogeneous:
            first = bound.setdefault(variable, (i, type_str))
            if first[1] != type_str:
                raise OnnxImportError(f"{label} (opset {opset}): input #{i} ({param.name}) is {type_str[7:-1]} "
                                      f"but input #{first[0]} is {first[1][7:-1]}; both are of type {variable}")
