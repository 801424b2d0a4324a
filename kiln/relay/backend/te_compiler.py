"""Lowering a primitive (fused) Relay function to one compiled kernel.

For each call in the function, in order, the op's implementation is selected
from its attributes (`strategy.select_implementation`: target kind, input
dtypes, and a label forced through `PassContext(config={"relay.backend.use_label":
{op: label}})`) and its compute builds te tensors from the tensors of the
call's arguments. The
anchor is the call with the most general `TOpPattern` (the last among equals);
the group's other stages without reductions are inlined (except a compute's
internal stages marked `KEEP`, which its schedule places), and the anchor's
implementation schedules the rest. A constant of one element becomes an
immediate in the code; larger constants are extra kernel arguments. Groups that
are structurally equal (same ops, attrs, types) on the same target compile once.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np

from kiln import te
from kiln.errors import KilnError
from kiln.ir.transform import PassContext, register_config
from kiln.ir.types import Dim, SumDim, SymDim, TensorType, TupleType, Type
from kiln.registry import Implementation, Op, OpPattern, attr
from kiln.relay import expr as rx
from kiln.relay.analysis import structural_hash
from kiln.relay.backend.strategy import select_implementation
from kiln.relay.op._schedule import KEEP, schedule_injective
from kiln.relay.visitor import post_order
from kiln.runtime import library_cache
from kiln.target import Target
from kiln.tir.expr import IntImm
from kiln.tir.functor import same_expr
from kiln.tir.pipeline import optimize_tir
from kiln.tir.simplify import simplify

USE_LABEL = "relay.backend.use_label"
register_config(USE_LABEL, dict, "op name -> the implementation label lowering must use for it")


class LoweringError(KilnError):
    """A primitive function that cannot be lowered (unsupported node, a compute that broke its contract)."""


def tensor_types(t: Type, where: str) -> list[TensorType]:
    """The tensors a value of type `t` is made of, nested tuples flattened in order (iteratively:
    tuples may nest thousands deep)."""
    out: list[TensorType] = []
    stack = [t]
    while stack:
        cur = stack.pop()
        if isinstance(cur, TensorType):
            out.append(cur)
        elif isinstance(cur, TupleType):
            stack.extend(reversed(cur.fields))
        else:
            raise LoweringError(f"{where}: cannot lower a value of type {cur}")
    return out


def field_slice(item: rx.TupleGetItem) -> slice:
    """Where field `item.index` lies among the flattened tensors of its tuple."""
    tt = item.tuple_value.checked_type
    assert isinstance(tt, TupleType)
    start = sum(len(tensor_types(f, "a tuple field")) for f in tt.fields[: item.index])
    return slice(start, start + len(tensor_types(tt.fields[item.index], "a tuple field")))


V = TypeVar("V")


def flat_values(
    func: rx.Function,
    param: Callable[[rx.Var], list[V]],
    constant: Callable[[rx.Constant], list[V]],
    call: Callable[[rx.Call, list[V]], list[V]],
    error: Callable[[str], Exception],
    where: str,
) -> list[V]:
    """The one walk from Relay to kernel values: `func`'s body as one V per tensor it is made of.

    A parameter or constant is what `param` / `constant` make of it; a tuple is
    its fields' values in order (nested tuples flat); a TupleGetItem its
    field's slice; a call `call(node, the values of its arguments)`. Function
    values (the fused groups main calls) are not walked into. relay.build maps
    main to buffer slots with it, lowering maps a fused group to te tensors.

    Raises:
        what `error(message)` makes, for a free variable or a node that cannot be lowered, naming `where`.
    """
    env: dict[int, list[V]] = {id(p): param(p) for p in func.params}
    for node in post_order(func.body, leaf=lambda n: isinstance(n, rx.Function)):
        if id(node) in env or isinstance(node, rx.Function):
            continue
        if isinstance(node, rx.Var):
            raise error(f"free variable {node.name_hint!r} in {where}")
        if isinstance(node, rx.Constant):
            env[id(node)] = constant(node)
        elif isinstance(node, rx.Tuple):
            env[id(node)] = [v for f in node.fields for v in env[id(f)]]
        elif isinstance(node, rx.TupleGetItem):
            env[id(node)] = env[id(node.tuple_value)][field_slice(node)]
        elif isinstance(node, rx.Call):
            env[id(node)] = call(node, [v for a in node.args for v in env[id(a)]])
        else:
            raise error(f"cannot lower a {type(node).__name__} in {where}")
    return env[id(func.body)]


def _same_dim(got: Any, want: Dim) -> bool:
    """Whether te's dim `got` is the type's dim `want` (a symbolic one: equal once both are simplified)."""
    if isinstance(want, int):
        return isinstance(got, IntImm) and got.value == want
    return isinstance(want, (SymDim, SumDim)) and same_expr(simplify(got), simplify(te.as_index(want)))


def _is_immediate(node: rx.Constant) -> bool:
    """Whether a constant is compiled into the kernel (one element) rather than passed to it."""
    return bool(node.data.size == 1)


class _Lowerer:
    def __init__(self, func: rx.Function, target: Target) -> None:
        self.func = func
        self.target = target
        self.dims: dict[int, Any] = {}
        self.inputs: list[te.Tensor] = []
        self.constants: list[np.ndarray] = []
        self.labels: dict[str, str] = dict(PassContext.current().config.get(USE_LABEL) or {})
        self._chosen: dict[int, Implementation] = {}  # per call: chosen once for the cache key and for lowering

    def _implementation(self, call: rx.Call, op: Op) -> Implementation:
        impl = self._chosen.get(id(call))
        if impl is None:
            dtypes = [str(t.dtype) for a in call.args for t in tensor_types(a.checked_type, "an argument")]
            impl = self._chosen[id(call)] = select_implementation(op, self.target, dtypes, self.labels.get(op.name))
        return impl

    def choices(self) -> tuple[Any, ...]:
        """What lowering will read from the registry, per op call: its implementation and pattern.

        Part of the kernel cache's key, so a registration made after a kernel was compiled is not
        served that kernel.
        """
        out: list[Any] = []
        for node in post_order(self.func.body):
            if isinstance(node, rx.Call) and isinstance(node.op, Op):
                out.append((self._implementation(node, node.op), node.op.get_attr(attr.TOpPattern, OpPattern.OPAQUE)))
        return tuple(out)

    def _shape(self, ty: TensorType, where: str) -> list[Any]:
        """The dims of `ty` for te: ints, and symbolic dims (`n`, `2*n`) that te makes size variables of."""
        for d in ty.shape:
            if not isinstance(d, (int, SymDim, SumDim)):
                raise LoweringError(f"{where}: dim {d} is neither static nor symbolic")
        return list(ty.shape)

    def _placeholder(self, ty: TensorType, name: str, where: str) -> te.Tensor:
        t = te.placeholder(self._shape(ty, where), dtype=str(ty.dtype), name=name)
        self.inputs.append(t)
        return t

    def _immediate(self, node: rx.Constant) -> te.Tensor:
        """A one-element constant as a stage whose value is the constant: inlined, it is an immediate."""
        value = node.data.reshape(()).item()
        dtype = str(node.type.dtype)
        return te.compute(self._shape(node.type, "a constant"), lambda *i: te.const(value, dtype), name="const")

    def _param(self, p: rx.Var) -> list[te.Tensor]:
        # a tuple parameter (split's result read by a fused op) is one placeholder per field
        tys = tensor_types(p.checked_type, f"parameter {p.name_hint}")
        names = [p.name_hint] if len(tys) == 1 else [f"{p.name_hint}_{i}" for i in range(len(tys))]
        return [self._placeholder(ty, n, f"parameter {p.name_hint}") for ty, n in zip(tys, names, strict=True)]

    def _constant(self, node: rx.Constant) -> list[te.Tensor]:
        if _is_immediate(node):
            return [self._immediate(node)]
        self.constants.append(np.array(node.data, copy=True))  # as _tensor_constants makes them
        return [self._placeholder(node.type, f"const{len(self.constants)}", "a constant")]

    def run(self) -> tuple[te.Schedule, list[te.Tensor], list[te.Tensor]]:
        anchor: tuple[OpPattern, Any, list[te.Tensor]] | None = None

        def call(node: rx.Call, inputs: list[te.Tensor]) -> list[te.Tensor]:
            nonlocal anchor
            if not isinstance(node.op, Op):
                raise LoweringError("cannot lower a call of a function value inside a primitive function")
            outs, pattern, impl = self._call(node, inputs)
            if anchor is None or pattern >= anchor[0]:
                anchor = (pattern, impl, outs)
            return outs

        body = flat_values(self.func, self._param, self._constant, call, LoweringError, "a primitive function")
        outs = self._distinct(body)
        sch = te.create_schedule(outs)
        out_ops = {id(t.op) for t in outs}
        if anchor is None or anchor[0] <= OpPattern.INJECTIVE:
            anchor_outs, schedule = outs, (anchor[1].schedule if anchor else schedule_injective)
        else:
            anchor_outs, schedule = anchor[2], anchor[1].schedule
        keep = out_ops | {id(t.op) for t in anchor_outs}
        for stage in list(sch.stages):
            if (id(stage.op) not in keep and not stage.op.reduce_axis and not stage.op.attrs.get(KEEP)
                    and stage.attach_type is te.AttachType.ROOT):
                stage.compute_inline()
        schedule(sch, anchor_outs, outs, self.target)
        return sch, self.inputs, outs

    def _call(self, call: rx.Call, inputs: list[te.Tensor]) -> tuple[list[te.Tensor], OpPattern, Any]:
        op = call.op
        assert isinstance(op, Op)
        impl = self._implementation(call, op)
        out_types = tensor_types(call.checked_type, f"op {op.name}")
        try:
            outs = impl.compute(call.attrs, inputs, call.checked_type)
        except te.TEError as err:
            raise LoweringError(f"op {op.name}: implementation {impl.name!r}: {err}") from err
        if not isinstance(outs, (list, tuple)) or len(outs) != len(out_types) or not all(
            isinstance(t, te.Tensor) for t in outs
        ):
            raise LoweringError(
                f"op {op.name}: implementation {impl.name!r} returned {outs!r}; expected a list of "
                f"{len(out_types)} te tensor(s)"
            )
        for t, ty in zip(outs, out_types, strict=True):
            same = len(t.shape) == len(ty.shape) and all(
                _same_dim(got, want) for got, want in zip(t.shape, ty.shape, strict=True))
            if not same or t.dtype != str(ty.dtype):
                raise LoweringError(
                    f"op {op.name}: implementation {impl.name!r} computed {t.dtype}[{', '.join(map(str, t.shape))}], "
                    f"but the op's type is {ty}"
                )
        return list(outs), op.get_attr(attr.TOpPattern, OpPattern.OPAQUE), impl

    def _distinct(self, outs: list[te.Tensor]) -> list[te.Tensor]:
        """The outputs, each its own computed tensor (an input or a repeat gets a copy stage)."""
        seen: set[int] = set()
        result = []
        for t in outs:
            if id(t.op) in seen or isinstance(t.op, te.PlaceholderOp):
                src = t
                t = te.compute(src.shape, lambda *i, s=src: s[i], name=f"{src.name}_copy")
            seen.add(id(t.op))
            result.append(t)
        return result


class CompiledKernel:
    """One compiled primitive function: call it with numpy inputs, get numpy outputs."""

    def __init__(self, name: str, module: Any, n_inputs: int, constants: list[np.ndarray],
                 out_types: list[TensorType]) -> None:
        self.name = name
        self.module = module
        self.n_inputs = n_inputs
        self.constants = constants
        self.out_types = out_types

    def __call__(self, *inputs: np.ndarray, outs: Sequence[np.ndarray] | None = None) -> list[np.ndarray]:
        """Runs the kernel; allocates the outputs unless `outs` are given."""
        if outs is None:
            outs = [np.empty([d for d in ty.shape if isinstance(d, int)], str(ty.dtype)) for ty in self.out_types]
        self.module(*inputs, *self.constants, *outs)
        return list(outs)


_CACHE: OrderedDict[tuple[int, str, tuple[Any, ...]], list[tuple[rx.Function, CompiledKernel]]] = OrderedDict()
_CACHE_LOCK = threading.Lock()
_CACHE_LIMIT = 128  # distinct (hash, target) keys kept; each kernel holds a JIT engine (about 50 KB)


def _tensor_constants(func: rx.Function) -> list[np.ndarray]:
    """The constants of `func` that its kernel takes as arguments, in the order lowering makes them."""
    found: list[np.ndarray] = []

    def constant(node: rx.Constant) -> list[None]:
        if not _is_immediate(node):
            found.append(np.array(node.data, copy=True))  # writeable, 0-d stays 0-d
        return []

    flat_values(func, lambda p: [], constant, lambda node, ins: [], LoweringError, "a primitive function")
    return found


def compile_primitive(func: rx.Function, target: Target | str = "llvm", name: str = "fused") -> CompiledKernel:
    """Lowers and compiles the type-checked primitive function `func` for `target`.

    Structurally equal functions compile once per target (and per forced labels); functions that
    differ only in the values of their tensor constants (ResNet's blocks: the same convolution
    with other weights) share one compiled module, each kernel with its own constants. With
    `KILN_CACHE=0` (no caches, `kiln.runtime.library_cache.enabled`) every call compiles.
    """
    from kiln.relay.analysis import structural_equal

    tgt = target if isinstance(target, Target) else Target(target)
    lowerer = _Lowerer(func, tgt)
    key = (structural_hash(func, tensor_values=False), f"{tgt} {sorted(lowerer.labels.items())}", lowerer.choices())
    cached = library_cache.enabled()
    with _CACHE_LOCK:
        for other, kernel in _CACHE.get(key, []) if cached else []:
            if structural_equal(other, func, tensor_values=False):
                _CACHE.move_to_end(key)
                if other is func:
                    return kernel
                return CompiledKernel(name, kernel.module, len(func.params), _tensor_constants(func), kernel.out_types)
    with te.size_vars():  # a symbolic dim is one size variable throughout the kernel
        sch, inputs, outs = lowerer.run()
        module = tgt.backend()(optimize_tir(te.lower(sch, [*inputs, *outs], name=name)), tgt)
    out_types = tensor_types(func.body.checked_type, "the result")
    kernel = CompiledKernel(name, module, len(func.params), lowerer.constants, out_types)
    if cached:
        with _CACHE_LOCK:
            _CACHE.setdefault(key, []).append((func, kernel))
            while len(_CACHE) > _CACHE_LIMIT:
                _CACHE.popitem(last=False)
    return kernel
