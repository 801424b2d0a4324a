"""What the Relay text printer and parser share: literals, names, types, attribute values, metadata.

Every spelling of the text format that both sides must agree on lives here,
next to its inverse, so that a change to one cannot forget the other.

Constants. A constant of at most `INLINE_LIMIT` elements is written inline, each
element with its exact dtype: `1f` (float32), `1.5f16`, `2f64`, `7` (int32),
`7i8`, `7i16`, `7i64`, `7u8`, `True`/`False` (bool); specials are `nanf`,
`inff`, `-inff` (`nanf16`, `-inff64`, ...). Arrays nest brackets:
`[[1f, 2f], [3f, 4f]]`. A float prints as the shortest text that reads back
to the same bits (`_float_body`); a constant with an element that has none (a NaN with a
non-default payload or sign) or with no elements goes to the metadata section,
as do large ones.

Metadata. `meta[relay.Constant][i]` refers to line `i` of the section that
follows the line `#[metadata]` at the end of the text, one constant a line:
`relay.Constant[i] float32 (2, 3) base64:<little-endian C-order bytes>`.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from kiln.ir.dtype import DataType
from kiln.ir.types import FuncType, IncompleteType, SumDim, SymDim, TensorType, TupleType, Type, TypeVar

METADATA_HEADER = "#[metadata]"
INLINE_LIMIT = 16
IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# dtype name -> literal suffix; int32 and (unsuffixed floats when parsing) float32 are the defaults.
DTYPE_SUFFIX = {
    "float16": "f16",
    "float32": "f",
    "float64": "f64",
    "int8": "i8",
    "int16": "i16",
    "int32": "",
    "int64": "i64",
    "uint8": "u8",
}
SUFFIX_DTYPE = {suffix: name for name, suffix in DTYPE_SUFFIX.items() if suffix} | {"f32": "float32", "i32": "int32"}

_NUMBER_BODY = r"-?(?:inf|nan|\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)"
_SUFFIXES = r"f16|f32|f64|f|i8|i16|i32|i64|u8"
NUMBER_TOKEN = rf"{_NUMBER_BODY}(?:{_SUFFIXES})?(?![A-Za-z0-9_])"  # a number as the lexer finds it
NUMBER = re.compile(rf"({_NUMBER_BODY})({_SUFFIXES})?(?![A-Za-z0-9_])")  # the same, split into body and suffix
_INT_BODY = re.compile(r"-?\d+")


# ---------------------------------------------------------------------------
# Names
# ---------------------------------------------------------------------------


def name_text(sigil: str, name: str) -> str:
    """`%x` / `@main` for identifier names, `%"input.1"` (a JSON string) for any other name."""
    return sigil + name if IDENT.fullmatch(name) else sigil + json.dumps(name)


def read_name(token: str) -> str:
    """The name in a `%x`, `%"x.1"`, `@f` token (without its sigil)."""
    body = token[1:]
    return str(json.loads(body)) if body.startswith('"') else body


# ---------------------------------------------------------------------------
# Constants
# ---------------------------------------------------------------------------


def _same_bits(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> bool:
    return bool(a.dtype == b.dtype and a.tobytes() == b.tobytes())


def _float_body(x: np.ndarray[Any, Any]) -> str:
    """The shortest text that reads back to this finite value in its precision, the same under every numpy.

    Positional from 1e-4 up to 10**precision (1e16 for float64, as Python writes floats), scientific
    outside: numpy >= 2.3's `str`. numpy 2.2 (the last for Python 3.10) wrote float16 and float32
    positionally up to 1e16 (`65500` for float16 65504, where 2.3 writes `6.55e+04`).
    """
    value: np.floating[Any] = x.dtype.type(x)  # the scalar: formatted in its own precision, not as a Python float
    magnitude = abs(float(value))
    upper = 1e16 if x.dtype == np.float64 else 10.0 ** np.finfo(x.dtype).precision
    if magnitude == 0 or 1e-4 <= magnitude < upper:
        return np.format_float_positional(value, unique=True, trim="-")
    return np.format_float_scientific(value, unique=True, trim="-", exp_digits=2)


def element_text(x: np.ndarray[Any, Any]) -> str | None:
    """One element (a 0-d array) as a literal, or None when no literal reads back to the same bits."""
    dtype = x.dtype
    if dtype == np.bool_:
        return "True" if bool(x) else "False"
    suffix = DTYPE_SUFFIX.get(dtype.name)
    if suffix is None:
        return None
    if dtype.kind in "iu":
        return f"{int(x)}{suffix}"
    value = x[()]
    if np.isnan(value):
        body = "nan"
    elif np.isinf(value):
        body = "inf" if value > 0 else "-inf"
    else:
        body = _float_body(x)
    try:
        back = literal_array(body + suffix)
    except ValueError:
        return None
    return body + suffix if _same_bits(back, x) else None


def constant_text(data: np.ndarray[Any, Any]) -> str | None:
    """A small constant as an inline literal, or None when it belongs in the metadata section."""
    if data.size == 0 or data.size > INLINE_LIMIT:
        return None
    flat = np.ascontiguousarray(data, dtype=data.dtype.newbyteorder("=")).reshape(-1)  # native order, as parsed
    items: list[str] = []
    for i in range(flat.size):
        text = element_text(flat[i : i + 1].reshape(()))
        if text is None:
            return None
        items.append(text)
    for dim in reversed(data.shape):  # group the flat items into nested brackets, innermost dim first
        items = ["[" + ", ".join(items[k : k + dim]) + "]" for k in range(0, len(items), dim)]
    return items[0]


def literal_array(text: str) -> np.ndarray[Any, Any]:
    """A scalar literal (`1f`, `-3i8`, `nanf16`, `True`) as a 0-d array of its exact dtype.

    Raises:
        ValueError: the text is no literal, or its value does not fit its dtype.
    """
    if text in ("True", "False"):
        return np.array(text == "True", dtype=np.bool_)
    match = NUMBER.fullmatch(text)
    if match is None:
        raise ValueError(f"not a literal: {text!r}")
    body, suffix = match.groups()
    is_int = _INT_BODY.fullmatch(body) is not None
    dtype = np.dtype(SUFFIX_DTYPE[suffix] if suffix else ("int32" if is_int else "float32"))
    if dtype.kind == "f":
        with np.errstate(over="ignore"):
            return np.array(float(body), dtype=dtype)
    if not is_int:
        raise ValueError(f"{body} is not an integer, but the suffix {suffix!r} makes it {dtype.name}")
    value = int(body)
    info = np.iinfo(dtype)
    if not info.min <= value <= info.max:
        raise ValueError(f"{value} does not fit in {dtype.name} (range [{info.min}, {info.max}])")
    return np.array(value, dtype=dtype)


def metadata_line(index: int, data: np.ndarray[Any, Any]) -> str:
    """The metadata line of constant `index`: dtype, shape and base64 of its little-endian bytes."""
    array = np.asarray(data, order="C")  # (np.ascontiguousarray would make a 0-d array 1-d)
    little = array.astype(array.dtype.newbyteorder("<"), copy=False)
    payload = base64.b64encode(little.tobytes()).decode("ascii")
    return f"relay.Constant[{index}] {array.dtype.name} {shape_text(array.shape)} base64:{payload}"


_METADATA_LINE = re.compile(r"relay\.Constant\[(\d+)\]\s+(\w+)\s+\(([0-9,\s]*)\)\s+base64:([A-Za-z0-9+/=]*)")


def read_metadata_line(line: str) -> tuple[int, np.ndarray[Any, Any]]:
    """Reads a line written by `metadata_line` back to (index, array), bit for bit.

    Raises:
        ValueError: the line is malformed or its bytes do not fit its dtype and shape.
    """
    match = _METADATA_LINE.fullmatch(line.strip())
    if match is None:
        raise ValueError("expected 'relay.Constant[<index>] <dtype> (<shape>) base64:<data>'")
    index, dtype_name, dims, payload = match.groups()
    try:
        dtype = DataType.of(dtype_name).numpy()
    except Exception as err:
        raise ValueError(str(err)) from None
    shape = tuple(int(d) for d in dims.replace(",", " ").split())
    try:
        raw = base64.b64decode(payload, validate=True)
    except ValueError:
        raise ValueError("the base64 data is malformed") from None
    count = int(np.prod(shape, dtype=np.int64))
    if len(raw) != count * dtype.itemsize:
        raise ValueError(
            f"{len(raw)} bytes of data, but {dtype.name} {shape_text(shape)} needs {count * dtype.itemsize}"
        )
    array = np.frombuffer(raw, dtype=dtype.newbyteorder("<")).astype(dtype).reshape(shape)
    return int(index), array


# ---------------------------------------------------------------------------
# Types
# ---------------------------------------------------------------------------


def shape_text(shape: Sequence[Any]) -> str:
    """`(1, n, ?)`, `(3,)` or `()`."""
    dims = ", ".join(str(d) for d in shape)
    return f"({dims},)" if len(shape) == 1 else f"({dims})"


def type_text(t: Type, limit: int | None = None) -> str:
    """A type as the text format writes it (incomplete types print `?`, with no id).

    Written with an explicit stack: a tuple type nests as deep as the tuples of the
    graph. With `limit`, the text stops after about that many characters, ending in `...`
    (for comments, which nothing reads back).
    """
    out: list[str] = []
    size = 0
    # items: a type to write, or a literal string
    stack: list[Type | str] = [t]
    while stack:
        if limit is not None and size > limit:
            out.append("...")
            break
        cur = stack.pop()
        if isinstance(cur, str):
            piece = cur
        elif isinstance(cur, TensorType):
            piece = f"Tensor[{shape_text(cur.shape)}, {cur.dtype}]"
        elif isinstance(cur, TupleType):
            parts: list[Type | str] = ["("]
            for n, f in enumerate(cur.fields):
                parts.extend([", "] if n else [])
                parts.append(f)
            parts.append(",)" if len(cur.fields) == 1 else ")")
            stack.extend(reversed(parts))
            continue
        elif isinstance(cur, FuncType):
            params = f"<{', '.join(p.name for p in cur.type_params)}>" if cur.type_params else ""
            parts = [f"fn {params}("]
            for n, a in enumerate(cur.arg_types):
                parts.extend([", "] if n else [])
                parts.append(a)
            parts.extend([") -> ", cur.ret_type])
            stack.extend(reversed(parts))
            continue
        elif isinstance(cur, TypeVar):
            piece = cur.name
        elif isinstance(cur, IncompleteType):
            piece = "?"
        else:
            piece = str(cur)
        out.append(piece)
        size += len(piece)
    return "".join(out)


# ---------------------------------------------------------------------------
# Attribute values
# ---------------------------------------------------------------------------


def attr_value_text(value: Any) -> str:
    """An attribute value: `True`, `3`, `0.5`, `"NCHW"`, `None`, `float16`, `[1, 2]`, `[[0, 0], [1, 1]]`."""
    if value is None or isinstance(value, bool | np.bool_):
        return str(None if value is None else bool(value))
    if isinstance(value, int | np.integer):
        return str(int(value))
    if isinstance(value, float | np.floating):
        return repr(float(value))  # the shortest text that reads back to the same double
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, DataType):
        return value.name
    if isinstance(value, SymDim | SumDim):
        return json.dumps(str(value))  # a size in a dims attribute, read back by its converter
    if isinstance(value, tuple | list):
        return "[" + ", ".join(attr_value_text(v) for v in value) + "]"
    return repr(value)  # not a kind of value the format knows; the parser will refuse it


def attr_number(text: str) -> int | float:
    """An attribute number (`3`, `-1`, `0.5`, `1e-05`, `inf`, `nan`) as a Python int or float.

    Raises:
        ValueError: the number carries a dtype suffix (attribute values have none).
    """
    match = NUMBER.fullmatch(text)
    if match is None or match.group(2):
        raise ValueError("attribute numbers are written without a dtype suffix")
    body = match.group(1)
    return int(body) if _INT_BODY.fullmatch(body) else float(body)


def lists_to_tuples(value: Any) -> Any:
    """Parsed attribute lists become tuples, at every depth, as the attrs converters expect."""
    if isinstance(value, list):
        return tuple(lists_to_tuples(v) for v in value)
    return value
