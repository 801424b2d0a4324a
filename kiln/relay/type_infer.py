"""Type inference: union-find over types and a worklist of type relations.

Each call of an op contributes one relation, the op's `FTypeRelation`, over its
argument types and a fresh output type; vars, lets, tuples, ifs and functions
contribute unifications. The worklist runs the relations until none makes
progress. Every independent error of a function is collected and reported in
one `TypeInferenceError`, each with the op, the argument, expected against
found, the span and the IR around the failing call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs

from kiln.errors import KilnError
from kiln.ir.diagnostics import Diagnostic, DiagnosticError, render_all
from kiln.ir.dtype import DataType
from kiln.ir.module import IRModule
from kiln.ir.types import (
    ANY,
    AnyDim,
    Dim,
    FuncType,
    IncompleteType,
    TensorType,
    TupleType,
    Type,
    is_complete,
)
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
from kiln.relay.op._rel import RelationError
from kiln.relay.visitor import post_order


class TypeInferenceError(DiagnosticError, TypeError):
    """Type inference failed; `diagnostics` lists every independent error."""

    def __init__(self, diagnostics: Sequence[Diagnostic], root: Expr | None, where: str = "") -> None:
        def excerpt(node: Any) -> str | None:
            if root is None:
                return None
            try:
                from kiln.relay.printer import excerpt as print_excerpt
            except ImportError:  # the text format is optional for diagnostics
                return None
            return str(print_excerpt(root, node))

        message = render_all(diagnostics, excerpt, where).replace("error", "type error", 1)
        super().__init__(diagnostics, message)


class _UnifyError(Exception):
    pass


@attrs.define
class _Relation:
    node: Expr  # the Call (or TupleGetItem) the relation belongs to
    op_name: str
    arg_names: tuple[str, ...]
    fn: Callable[[list[Type], Any], Type | None]
    attrs: Any
    args: list[Type]
    out: Type


class _Solver:
    """Union-find over IncompleteTypes, with structural unification."""

    def __init__(self) -> None:
        self.parent: dict[int, Type] = {}

    def resolve(self, t: Type) -> Type:
        """`t` with every solved IncompleteType replaced by its solution."""
        if isinstance(t, IncompleteType):
            seen = []
            cur: Type = t
            while isinstance(cur, IncompleteType) and id(cur) in self.parent:
                seen.append(cur)
                cur = self.parent[id(cur)]
            for s in seen:  # path compression
                self.parent[id(s)] = cur
            return cur if isinstance(cur, IncompleteType) else self.resolve(cur)
        if isinstance(t, TupleType):
            fields = tuple(self.resolve(f) for f in t.fields)
            return t if all(a is b for a, b in zip(fields, t.fields, strict=True)) else TupleType(fields)
        if isinstance(t, FuncType):
            return FuncType([self.resolve(a) for a in t.arg_types], self.resolve(t.ret_type), t.type_params)
        return t

    def unify(self, a: Type, b: Type) -> Type:
        """Makes `a` and `b` the same type; raises _UnifyError saying how they differ."""
        a, b = self.resolve(a), self.resolve(b)
        if a is b:
            return a
        if isinstance(a, IncompleteType):
            self.parent[id(a)] = b
            return b
        if isinstance(b, IncompleteType):
            self.parent[id(b)] = a
            return a
        if isinstance(a, TensorType) and isinstance(b, TensorType):
            if a.dtype != b.dtype:
                raise _UnifyError(f"expected dtype {a.dtype}, found {b.dtype}")
            if len(a.shape) != len(b.shape):
                raise _UnifyError(f"expected {a}, found {b} (rank {len(a.shape)} against {len(b.shape)})")
            dims = [_unify_dim(x, y, a, b) for x, y in zip(a.shape, b.shape, strict=True)]
            return a if dims == list(a.shape) else TensorType(tuple(dims), a.dtype)
        if isinstance(a, TupleType) and isinstance(b, TupleType):
            if len(a.fields) != len(b.fields):
                raise _UnifyError(f"expected a tuple of {len(a.fields)}, found one of {len(b.fields)}")
            return TupleType([self.unify(x, y) for x, y in zip(a.fields, b.fields, strict=True)])
        if isinstance(a, FuncType) and isinstance(b, FuncType):
            if len(a.arg_types) != len(b.arg_types):
                raise _UnifyError(f"expected a function of {len(a.arg_types)} arguments, found {len(b.arg_types)}")
            args = [self.unify(x, y) for x, y in zip(a.arg_types, b.arg_types, strict=True)]
            return FuncType(args, self.unify(a.ret_type, b.ret_type))
        if a == b:
            return a
        raise _UnifyError(f"expected {a}, found {b}")


def _unify_dim(x: Dim, y: Dim, a: TensorType, b: TensorType) -> Dim:
    if x == y:
        return x
    if isinstance(x, AnyDim):
        return y
    if isinstance(y, AnyDim):
        return x
    raise _UnifyError(f"expected {a}, found {b}")


class _Inferencer:
    def __init__(self, module: IRModule | None) -> None:
        self.module = module
        self.solver = _Solver()
        self.types: dict[int, Type] = {}
        self.relations: list[_Relation] = []
        self.errors: list[Diagnostic] = []
        self.nodes: list[Expr] = []
        # (node, annotated type, inferred type, what): compared after the relations are solved
        self.checks: list[tuple[Expr, Type, Type, str]] = []

    def error(self, node: Expr, message: str) -> None:
        self.errors.append(Diagnostic(message, node, node.span))

    def type_of(self, node: Expr) -> Type:
        return self.types[id(node)]

    def unify_at(self, node: Expr, a: Type, b: Type, what: str) -> None:
        try:
            self.solver.unify(a, b)
        except _UnifyError as err:
            self.error(node, f"{what}: {err}")

    # -- collecting constraints -----------------------------------------------------

    def collect(self, root: Expr, reuse: bool = False) -> None:
        typed = _has_type if reuse else None
        for node in post_order(root, typed):
            self.nodes.append(node)
            self.types[id(node)] = node.checked_type if reuse and node.has_type else self.constrain(node)

    def constrain(self, node: Expr) -> Type:
        if isinstance(node, Var):
            return node.type_annotation if node.type_annotation is not None else IncompleteType()
        if isinstance(node, Constant):
            return node.type
        if isinstance(node, GlobalVar):
            return self.global_type(node)
        if isinstance(node, Call):
            return self.constrain_call(node)
        if isinstance(node, Tuple):
            return TupleType([self.type_of(f) for f in node.fields])
        if isinstance(node, TupleGetItem):
            out = IncompleteType()
            getter = _tuple_get(node.index)
            tuple_type = self.type_of(node.tuple_value)
            self.relations.append(_Relation(node, "TupleGetItem", ("tuple",), getter, None, [tuple_type], out))
            return out
        if isinstance(node, Let):
            what = f"let %{node.var.name_hint}"
            if node.var.type_annotation is not None:  # checked once the value's type is solved
                self.checks.append((node, node.var.type_annotation, self.type_of(node.value), what))
            else:
                self.unify_at(node, self.type_of(node.var), self.type_of(node.value), what)
            return self.type_of(node.body)
        if isinstance(node, If):
            self.unify_at(node, TensorType((), DataType.of("bool")), self.type_of(node.cond), "if condition")
            out = IncompleteType()
            self.unify_at(node, out, self.type_of(node.true_branch), "if branches")
            self.unify_at(node, out, self.type_of(node.false_branch), "if branches")
            return out
        if isinstance(node, Function):
            body = self.type_of(node.body)
            if node.ret_type is not None:
                self.checks.append((node, node.ret_type, body, "function result"))
                body = node.ret_type
            return FuncType([self.type_of(p) for p in node.params], body)
        raise TypeError(f"unknown expression kind {type(node).__name__}")

    def constrain_call(self, node: Call) -> Type:
        out = IncompleteType()
        args = [self.type_of(a) for a in node.args]
        if not isinstance(node.op, Op):
            self.unify_at(node, self.type_of(node.op), FuncType(args, out), "call")
            return out
        op = node.op
        expected = op.num_inputs
        if expected is not None and expected != len(args):
            names = ", ".join(a.name for a in op.arguments)
            self.error(node, f"op {op.name} takes {expected} argument(s) ({names}), found {len(args)}")
            return out
        relation = op.get_attr(attr.FTypeRelation)
        if relation is None:
            self.error(node, f"op {op.name} has no type relation (FTypeRelation); register one with add_type_rel")
            return out
        attrs_type = op.attrs_type
        if attrs_type is not None and not isinstance(node.attrs, attrs_type):
            found = type(node.attrs).__name__ if node.attrs is not None else "no attrs"
            self.error(node, f"op {op.name} expects attrs {attrs_type.__name__}, found {found}")
            return out
        arg_names = tuple(a.name for a in op.arguments)
        self.relations.append(_Relation(node, op.name, arg_names, relation, node.attrs, args, out))
        return out

    def global_type(self, gvar: GlobalVar) -> Type:
        if self.module is None or gvar not in self.module:
            self.error(gvar, f"@{gvar.name_hint} is not a function of the module")
            return IncompleteType()
        func = self.module[gvar]
        if isinstance(func, Expr) and func.has_type:
            return func.checked_type
        if isinstance(func, Function) and func.ret_type is not None and all(p.type_annotation for p in func.params):
            return FuncType([p.type_annotation for p in func.params if p.type_annotation], func.ret_type)
        self.error(gvar, f"@{gvar.name_hint} is called before its type is known: annotate its parameters and result")
        return IncompleteType()

    # -- solving -------------------------------------------------------------------------

    def solve(self) -> None:
        pending = self.relations
        progress = True
        while pending and progress:
            progress = False
            waiting: list[_Relation] = []
            for rel in pending:
                args = [self.solver.resolve(t) for t in rel.args]
                try:
                    out = rel.fn(args, rel.attrs)
                except RelationError as err:
                    self.error(rel.node, self.describe(rel, err, args))
                    progress = True
                    continue
                except KilnError as err:
                    self.error(rel.node, f"op {rel.op_name}: {err}")
                    progress = True
                    continue
                if out is None:
                    waiting.append(rel)
                    continue
                progress = True
                try:
                    self.solver.unify(rel.out, out)
                except _UnifyError as err:
                    self.error(rel.node, f"op {rel.op_name}: its result {out} conflicts with its use: {err}")
            pending = waiting
        for node, expected, found, what in self.checks:
            self.unify_at(node, expected, found, what)
        if not self.errors:
            for rel in pending:
                inputs = ", ".join(str(self.solver.resolve(t)) for t in rel.args)
                self.error(rel.node, f"cannot infer the type of op {rel.op_name}: its inputs are ({inputs})")

    def describe(self, rel: _Relation, err: RelationError, args: list[Type]) -> str:
        where = f"op {rel.op_name}"
        if err.arg is not None:
            name = rel.arg_names[err.arg] if err.arg < len(rel.arg_names) else f"#{err.arg}"
            found = args[err.arg] if err.arg < len(args) else "?"
            where += f", argument {name} ({found})"
        return f"{where}: {err}"

    def finish(self) -> None:
        if self.errors:
            return
        for node in self.nodes:
            t = self.solver.resolve(self.types[id(node)])
            if not is_complete(t):
                if isinstance(node, Var):
                    self.error(node, f"cannot infer the type of %{node.name_hint}: annotate it")
                continue
            node.set_checked_type(t)


def _tuple_get(index: int) -> Callable[[list[Type], Any], Type | None]:
    def relation(args: list[Type], attrs: Any) -> Type | None:
        t = args[0]
        if isinstance(t, IncompleteType):
            return None
        if not isinstance(t, TupleType):
            raise RelationError(f"expected a tuple, found {t}", arg=0)
        if not -len(t.fields) <= index < len(t.fields):
            raise RelationError(f"index {index} is out of range for a tuple of {len(t.fields)}", arg=0)
        return t.fields[index]

    return relation


def _has_type(node: Expr) -> bool:
    return node.has_type


def infer_type(expr: Expr, module: IRModule | None = None, *, reuse: bool = False) -> Expr:
    """Types every node of `expr` (sets `checked_type`) and returns it.

    With `reuse`, a sub-expression that is typed already keeps its type and is
    not walked again: a graph built one node at a time (as the ONNX importer
    builds it) is then typed in linear time overall.

    Raises:
        TypeInferenceError: listing every independent error, each with the op,
            the argument, expected against found, the span and the IR around it.
    """
    inf = _Inferencer(module)
    inf.collect(expr, reuse)
    inf.solve()
    inf.finish()
    if inf.errors:
        raise TypeInferenceError(inf.errors, expr)
    return expr


__all__ = ["ANY", "Diagnostic", "TypeInferenceError", "infer_type"]
