"""The reference interpreter: runs a Relay module node by node on numpy arrays.

```python
ex = relay.create_executor("debug", mod)
out = ex.evaluate()(x_array, w_array)      # or ex(x=x_array, w=w_array)
```

Each op call runs the op's numpy reference (attribute `FReference`,
`(attrs, *arrays) -> array or tuple`). Values are numpy arrays, tuples of
values, and closures (a Function with the variables it captured). The
evaluation keeps its own stack of tasks, so a chain of any length runs without
touching Python's recursion limit; within one call of a function every node is
evaluated at most once (the graph is a DAG), and only the branch an `If` takes
is evaluated.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Union

import attrs
import numpy as np

from kiln.errors import KilnError, did_you_mean
from kiln.ir.module import IRModule
from kiln.ir.types import TensorType, TupleType, Type, size_name
from kiln.registry import Op, attr
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
)


class InterpreterError(KilnError, ValueError):
    """The interpreter cannot run a program: a missing or ill-shaped input, an op without a reference."""


Array = np.ndarray[Any, Any]
Value = Union[Array, tuple["Value", ...], "Closure"]  # a recursive alias needs Union


class _Env:
    """Variable bindings of one scope; lookups walk to the enclosing scopes."""

    __slots__ = ("parent", "values")

    def __init__(self, parent: _Env | None = None) -> None:
        self.values: dict[int, Value] = {}
        self.parent = parent

    def lookup(self, var: Var) -> Value:
        env: _Env | None = self
        while env is not None:
            value = env.values.get(id(var))
            if value is not None:
                return value
            env = env.parent
        raise InterpreterError(f"%{var.name_hint} is not bound" + (f" (at {var.span})" if var.span else ""))


@attrs.frozen(eq=False)
class Closure:
    """A function value: the Function and the scope it was defined in."""

    func: Function
    env: _Env | None = attrs.field(repr=False)


class _Frame:
    """One call of a function: its scope and the values of the nodes evaluated in it."""

    __slots__ = ("env", "memo")

    def __init__(self, env: _Env) -> None:
        self.env = env
        self.memo: dict[int, Value] = {}


# Task kinds of the evaluation stack.
_EVAL, _APPLY, _TUPLE, _GETITEM, _LET, _IF, _STORE = range(7)


def _span(node: Expr) -> str:
    return f" (at {node.span})" if node.span is not None else ""


def _normalize(value: Any) -> Value:
    if isinstance(value, np.ndarray | Closure):
        return value
    if isinstance(value, tuple | list):
        return tuple(_normalize(v) for v in value)
    return np.asarray(value)


def _conform(value: Value, t: Type | None) -> Value:
    """A reference's result in the dtype its call was typed with (references may widen)."""
    if isinstance(value, np.ndarray) and isinstance(t, TensorType):
        dtype = t.dtype.numpy()
        if value.dtype != dtype:
            return value.astype(dtype)
    elif isinstance(value, tuple) and isinstance(t, TupleType) and len(t.fields) == len(value):
        return tuple(_conform(v, f) for v, f in zip(value, t.fields, strict=True))
    return value


def run_op(op: Op, op_attrs: Any, args: Sequence[Value], where: Expr | None = None) -> Value:
    """Runs `op`'s numpy reference on `args` and returns its result (an array or a tuple).

    Raises:
        InterpreterError: the op has no FReference, or the reference failed.
    """
    reference: Callable[..., Any] | None = op.get_attr(attr.FReference)
    at = _span(where) if where is not None else ""
    if reference is None:
        raise InterpreterError(f"op {op.name} has no numpy reference (FReference), so it cannot be interpreted{at}")
    try:
        result = reference(op_attrs, *args)
    except KilnError:
        raise
    except Exception as err:
        shapes = ", ".join(str(getattr(a, "shape", "tuple")) for a in args)
        raise InterpreterError(f"op {op.name} failed on inputs of shapes ({shapes}){at}: {err}") from err
    out = _normalize(result)
    if where is not None and where.has_type:
        out = _conform(out, where.checked_type)
    return out


def _describe(value: Value) -> str:
    if isinstance(value, np.ndarray):
        return f"an array of shape {value.shape} and dtype {value.dtype}"
    if isinstance(value, tuple):
        return f"a tuple of {len(value)}"
    return "a function"


def _check_input(func_name: str, param: Var, value: Any) -> Value:
    """`value` as the interpreter holds it, checked against `param`'s type."""
    expected = param.type_annotation
    if expected is None and param.has_type:
        expected = param.checked_type
    what = f"{func_name}: input %{param.name_hint}"
    if isinstance(expected, TensorType):
        dtype = expected.dtype.numpy()
        if isinstance(value, np.ndarray):
            if value.dtype != dtype:
                raise InterpreterError(f"{what} expects dtype {expected.dtype}, got an array of dtype {value.dtype}")
        elif isinstance(value, tuple | Closure):
            raise InterpreterError(f"{what} expects {expected}, got {_describe(_normalize(value))}")
        else:
            try:
                value = np.asarray(value, dtype=dtype)
            except (TypeError, ValueError) as err:
                raise InterpreterError(f"{what} expects {expected}, got {value!r:.60}: {err}") from None
        if value.ndim != expected.ndim or any(
            isinstance(d, int) and d != s for d, s in zip(expected.shape, value.shape, strict=True)
        ):
            raise InterpreterError(f"{what} expects shape {expected.shape}, got an array of shape {value.shape}")
        return np.asarray(value)
    if isinstance(expected, TupleType):
        if not isinstance(value, tuple | list) or len(value) != len(expected.fields):
            raise InterpreterError(f"{what} expects {expected}, got {_describe(_normalize(value))}")
        return tuple(
            _check_input(func_name, Var(f"{param.name_hint}.{i}", t), v)
            for i, (t, v) in enumerate(zip(expected.fields, value, strict=True))
        )
    return _normalize(value)


class Interpreter:
    """Evaluates expressions of one module."""

    def __init__(self, mod: IRModule) -> None:
        self.mod = mod
        self.sizes: dict[str, int] = {}  # the size variables' values, from the inputs of the last call

    def _read_sizes(self, params: Sequence[Var], args: Sequence[Value]) -> None:
        """Sizes from inputs whose dims are a size variable (`n` in (n, 128)): the attrs of calls may name
        them (a reshape to (n, s, 768))."""
        for p, a in zip(params, args, strict=True):
            t = p.type_annotation or (p.checked_type if p.has_type else None)
            if isinstance(t, TensorType) and isinstance(a, np.ndarray):
                for d, got in zip(t.shape, a.shape, strict=False):
                    if (name := size_name(d)) is not None:
                        self.sizes[name] = got

    def _global(self, gvar: GlobalVar) -> Closure:
        if gvar not in self.mod:
            raise InterpreterError(f"@{gvar.name_hint} is not a function of the module")
        func = self.mod[gvar]
        if not isinstance(func, Function):
            raise InterpreterError(f"@{gvar.name_hint} is not a Relay function")
        return Closure(func, None)

    def call(self, callee: Closure, args: Sequence[Value], name: str = "function") -> Value:
        """Calls a function value with checked arguments."""
        func = callee.func
        if len(args) != len(func.params):
            raise InterpreterError(f"{name} takes {len(func.params)} argument(s), got {len(args)}")
        env = _Env(callee.env)
        for p, a in zip(func.params, args, strict=True):
            env.values[id(p)] = _check_input(name, p, a)
        self._read_sizes(func.params, [env.values[id(p)] for p in func.params])
        return self.eval(func.body, _Frame(env))

    def eval(self, root: Expr, frame: _Frame | None = None) -> Value:
        """The value of `root` in `frame` (a fresh, empty scope by default)."""
        values: list[Value] = []
        tasks: list[tuple[int, Expr, _Frame]] = [(_EVAL, root, frame or _Frame(_Env()))]
        push = tasks.append
        while tasks:
            kind, node, fr = tasks.pop()
            if kind == _EVAL:
                hit = fr.memo.get(id(node))
                if hit is not None:
                    values.append(hit)
                elif isinstance(node, Var):
                    values.append(fr.env.lookup(node))
                elif isinstance(node, Constant):
                    values.append(node.data)
                elif isinstance(node, Call | Tuple):
                    push((_APPLY if isinstance(node, Call) else _TUPLE, node, fr))
                    for child in reversed(node.children()):
                        push((_EVAL, child, fr))
                elif isinstance(node, TupleGetItem):
                    push((_GETITEM, node, fr))
                    push((_EVAL, node.tuple_value, fr))
                elif isinstance(node, Let):
                    push((_LET, node, fr))
                    push((_EVAL, node.value, fr))
                elif isinstance(node, If):
                    push((_IF, node, fr))
                    push((_EVAL, node.cond, fr))
                elif isinstance(node, Function):
                    closure = Closure(node, fr.env)
                    fr.memo[id(node)] = closure
                    values.append(closure)
                elif isinstance(node, GlobalVar):
                    values.append(self._global(node))
                else:
                    raise InterpreterError(f"the interpreter cannot run a {type(node).__name__}")
            elif kind == _APPLY:
                assert isinstance(node, Call)
                n = len(node.args)
                args = values[len(values) - n:]
                del values[len(values) - n:]
                if isinstance(node.op, Op):
                    op_attrs = node.attrs.with_sizes(self.sizes) if self.sizes and node.attrs else node.attrs
                    result = run_op(node.op, op_attrs, args, node)
                    fr.memo[id(node)] = result
                    values.append(result)
                    continue
                callee = values.pop()
                if not isinstance(callee, Closure):
                    raise InterpreterError(f"a call of {_describe(callee)}, which is not a function{_span(node)}")
                func = callee.func
                if len(args) != len(func.params):
                    raise InterpreterError(
                        f"a function of {len(func.params)} parameter(s) called with {len(args)}{_span(node)}"
                    )
                env = _Env(callee.env)
                for p, a in zip(func.params, args, strict=True):
                    env.values[id(p)] = a
                push((_STORE, node, fr))
                push((_EVAL, func.body, _Frame(env)))
            elif kind == _TUPLE:
                assert isinstance(node, Tuple)
                n = len(node.fields)
                fields = tuple(values[len(values) - n:])
                del values[len(values) - n:]
                fr.memo[id(node)] = fields
                values.append(fields)
            elif kind == _GETITEM:
                assert isinstance(node, TupleGetItem)
                tup = values.pop()
                if not isinstance(tup, tuple) or not -len(tup) <= node.index < len(tup):
                    raise InterpreterError(f"field {node.index} of {_describe(tup)}{_span(node)}")
                fr.memo[id(node)] = tup[node.index]
                values.append(tup[node.index])
            elif kind == _LET:
                assert isinstance(node, Let)
                fr.env.values[id(node.var)] = values.pop()
                push((_STORE, node, fr))
                push((_EVAL, node.body, fr))
            elif kind == _IF:
                assert isinstance(node, If)
                cond = values.pop()
                if not isinstance(cond, np.ndarray) or cond.size != 1:
                    raise InterpreterError(f"an if condition must be a scalar, got {_describe(cond)}{_span(node)}")
                push((_STORE, node, fr))
                push((_EVAL, node.true_branch if bool(cond.reshape(())) else node.false_branch, fr))
            else:  # _STORE: the value on top of the stack is the node's
                fr.memo[id(node)] = values[-1]
        assert len(values) == 1
        return values[0]


class Executor:
    """What `create_executor("debug", mod)` returns: `evaluate()(*args)` runs "main"."""

    def __init__(self, mod: IRModule, params: Mapping[str, Any] | None = None) -> None:
        self.mod = mod
        self.params = dict(params or {})
        self.interpreter = Interpreter(mod)

    def _bind_inputs(self, func: Function, name: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[Any]:
        names = [p.name_hint for p in func.params]
        if len(args) > len(names):
            raise InterpreterError(f"{name} takes {len(names)} input(s) ({', '.join(names)}), got {len(args)}")
        given: dict[str, Any] = {**self.params, **dict(zip(names, args, strict=False))}
        for key, value in kwargs.items():
            if key not in names:
                raise InterpreterError(
                    f"{name} has no input {key!r}{did_you_mean(key, names)}; its inputs: {', '.join(names)}"
                )
            if key in names[: len(args)]:
                raise InterpreterError(f"{name}: input {key!r} is given twice (by position and by name)")
            given[key] = value
        missing = [p for p in func.params if p.name_hint not in given]
        if missing:
            desc = ", ".join(f"%{p.name_hint}" + (f" ({p.type_annotation})" if p.type_annotation else "")
                             for p in missing)
            raise InterpreterError(f"{name} needs input(s) {desc}, which were not given")
        return [given[n] for n in names]

    def _runner(self, func: Function, name: str, env: _Env | None = None) -> Callable[..., Value]:
        def run(*args: Any, **kwargs: Any) -> Value:
            values = self._bind_inputs(func, name, args, kwargs)
            return self.interpreter.call(Closure(func, env), values, name)

        return run

    def evaluate(self, expr: Expr | None = None) -> Any:
        """A callable that runs "main" (or `expr`, if a function); the value of `expr` if it is not one.

        Args:
            expr: None for the module's "main", a Function or GlobalVar to get
                a callable for, or a closed expression to evaluate now.

        Returns:
            A callable `(*args, **inputs) -> value`, or the value of `expr`.
        """
        if expr is None:
            if "main" not in self.mod:
                raise InterpreterError("the module has no function main to evaluate")
            func = self.mod["main"]
            if not isinstance(func, Function):
                raise InterpreterError("main is not a Relay function")
            return self._runner(func, "@main")
        if isinstance(expr, GlobalVar):
            return self._runner(self.interpreter._global(expr).func, f"@{expr.name_hint}")
        if isinstance(expr, Function):
            return self._runner(expr, "function")
        value: Value = self.interpreter.eval(expr)
        return value

    def __call__(self, *args: Any, **inputs: Any) -> Value:
        """Runs "main" on `args` (by position) and `inputs` (by parameter name)."""
        out: Value = self.evaluate()(*args, **inputs)
        return out


_KINDS = ("debug", "interpreter")


def create_executor(
    kind: str = "debug",
    mod: IRModule | None = None,
    device: Any = None,
    target: Any = None,
    params: Mapping[str, Any] | None = None,
) -> Executor:
    """An executor for `mod`. Only "debug" (the reference interpreter, also "interpreter") is provided here.

    Args:
        kind: "debug".
        mod: the module; an empty one if None (then evaluate an expression).
        device: ignored (the interpreter runs on the host).
        target: ignored.
        params: values for inputs of main by name, used when a call does not give them.

    Returns:
        The Executor.
    """
    if kind not in _KINDS:
        raise InterpreterError(f"unknown executor kind {kind!r}{did_you_mean(kind, _KINDS)}; known: debug")
    return Executor(mod if mod is not None else IRModule(), params)


__all__ = ["Closure", "Executor", "Interpreter", "InterpreterError", "create_executor", "run_op"]
