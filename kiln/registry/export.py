"""The op registry as data: JSON records, a table, and one op in full."""

from __future__ import annotations

import enum
import json
from typing import Any

import attrs

from kiln.registry.attr import Implementation, TypeRelation
from kiln.registry.op import Op, op_registry


def _json_safe(value: object) -> object:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (tuple, list)):
        return [_json_safe(v) for v in value]
    return repr(value)


def _type_name(annotation: object) -> str:
    if isinstance(annotation, str):
        return annotation
    return str(getattr(annotation, "__name__", repr(annotation)))


def attrs_schema(cls: type | None) -> list[dict[str, Any]]:
    """Describes the fields of an attrs class: name, type, default, doc."""
    if cls is None:
        return []
    fields = []
    for field in attrs.fields(cls):
        default: object = field.default
        factory = getattr(default, "factory", None)  # an attrs.Factory default
        if callable(factory):
            default = "<computed>" if getattr(default, "takes_self", False) else factory()
        fields.append(
            {
                "name": field.name,
                "type": _type_name(field.type),
                "required": field.default is attrs.NOTHING,
                "default": None if field.default is attrs.NOTHING else _json_safe(default),
                "doc": field.metadata.get("doc", ""),
            }
        )
    return fields


def describe_value(value: object) -> str:
    """Returns a short readable form of an attribute value: functions by qualified name."""
    if isinstance(value, TypeRelation):
        return f"TypeRelation {value.name} ({describe_value(value.fn)})"
    if isinstance(value, Implementation):
        dts = "any dtype" if value.dtypes is None else "/".join(sorted(value.dtypes))
        label = f", label {value.label!r}" if value.label else ""
        return (f"{value.name}: {describe_value(value.compute)} scheduled by "
                f"{describe_value(value.schedule) if value.schedule else 'the target default'} "
                f"({dts}{label}, priority {value.priority})")
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    qualname = getattr(value, "__qualname__", None)
    if callable(value) and qualname:
        return f"{getattr(value, '__module__', '?')}.{qualname}"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def op_record(op: Op) -> dict[str, Any]:
    """Returns one op as a JSON-ready dict."""
    meta = op.meta
    return {
        "name": op.name,
        "description": meta.description,
        "num_inputs": op.num_inputs,
        "arguments": [
            {"name": a.name, "type": a.type_info, "description": a.description} for a in meta.arguments
        ],
        "attrs_type": meta.attrs_type.__name__ if meta.attrs_type else None,
        "attrs": attrs_schema(meta.attrs_type),
        "support_level": meta.support_level,
        "attr_keys": sorted(op_registry().attrs_of(op)),
        "gradient": gradient_status(op),
    }


def gradient_status(op: Op) -> str:
    """"registered", "none: <why>" (the op's TNonDifferentiable) or "missing": what reverse mode finds."""
    slots = op_registry().attrs_of(op)
    if "FPrimalGradient" in slots:
        return "registered"
    if "TNonDifferentiable" in slots:
        return f"none: {slots['TNonDifferentiable'].value}"
    return "missing"


def export_json(indent: int | None = 2) -> str:
    """Returns every registered op, once each, as a JSON list."""
    return json.dumps([op_record(op) for op in op_registry().list_keys()], indent=indent)


def format_table() -> str:
    """Returns one line per op: name, inputs, support level, attribute keys."""
    rows = [("op", "inputs", "level", "attribute keys")]
    for op in op_registry().list_keys():
        rec = op_record(op)
        inputs = ", ".join(a["name"] for a in rec["arguments"]) or "-"
        rows.append((op.name, inputs, str(rec["support_level"]), " ".join(rec["attr_keys"]) or "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row[:3], widths, strict=True)) + "  " + row[3] for row in rows]
    lines.insert(1, "-" * len(lines[0]))
    lines.append(f"{len(rows) - 1} ops")
    return "\n".join(lines)


def format_op(op: Op) -> str:
    """Returns everything the registry knows about one op, for `kiln ops NAME`."""
    meta = op.meta
    out = [op.name, "=" * len(op.name)]
    out.append(meta.description or "(no description)")
    out.append("")
    out.append(f"support level: {meta.support_level}")
    out.append(f"inputs ({op.num_inputs if op.num_inputs is not None else '?'}):")
    for a in meta.arguments:
        out.append(f"  {a.name}: {a.type_info}" + (f" -- {a.description}" if a.description else ""))
    out.append(f"attrs: {meta.attrs_type.__name__ if meta.attrs_type else '(none)'}")
    for f in attrs_schema(meta.attrs_type):
        default = "required" if f["required"] else f"default {f['default']!r}"
        out.append(f"  {f['name']}: {f['type']} ({default})" + (f" -- {f['doc']}" if f["doc"] else ""))
    out.append("attributes:")
    for name, slot in sorted(op_registry().attrs_of(op).items()):
        out.append(f"  {name}: {describe_value(slot.value)} (plevel {slot.plevel}, set at {slot.site})")
    return "\n".join(out)
