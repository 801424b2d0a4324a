"""Relay: the typed graph IR, its op library, type inference, and its text format.

`relay.add(...)`, `relay.nn.conv2d(...)` build calls; `relay.infer_type` and the
`relay.transform.InferType()` pass type them; `str(mod)` prints and
`relay.parse(text)` reads back.
"""

from kiln.ir.module import IRModule
from kiln.ir.types import ANY, FuncType, IncompleteType, SizeVar, TensorType, TupleType, TypeVar
from kiln.relay import analysis, transform
from kiln.relay.analysis import structural_equal, structural_hash
from kiln.relay.expr import (
    Call,
    Constant,
    Expr,
    Function,
    GlobalVar,
    If,
    Let,
    Tuple,
    TupleGetItem,
    Var,
    const,
    var,
)
from kiln.relay.op import nn
from kiln.relay.op.reduce import argmax, argmin, max, mean, min, prod, sum
from kiln.relay.op.tensor import (
    abs,
    add,
    cast,
    ceil,
    clip,
    cos,
    divide,
    equal,
    erf,
    exp,
    floor,
    floor_divide,
    floor_mod,
    greater,
    greater_equal,
    less,
    less_equal,
    log,
    logical_and,
    logical_not,
    logical_or,
    maximum,
    minimum,
    multiply,
    negative,
    not_equal,
    power,
    round,
    rsqrt,
    sigmoid,
    sign,
    sin,
    sqrt,
    subtract,
    tanh,
    where,
)
from kiln.relay.op.transform import (
    arange,
    broadcast_to,
    concatenate,
    expand_dims,
    full,
    ones,
    ones_like,
    reshape,
    shape_of,
    split,
    squeeze,
    stack,
    strided_slice,
    take,
    tile,
    transpose,
    zeros,
    zeros_like,
)
from kiln.relay.parser import ParseError, parse
from kiln.relay.type_infer import TypeInferenceError, infer_type

IRModule.make_global_var = GlobalVar
