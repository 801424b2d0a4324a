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
from kiln.registry.attr import RelationError
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
    """Union-find over IncompleteTypes, with structural unification.

    Types nest as deep as the tuples of a graph (a tuple of a tuple of ... 10,000
    deep): every walk here uses an explicit stack, and types found complete are
    remembered (they never change), so resolving a deep type again costs nothing.
    """

    def __init__(self) -> None:
        self.parent: dict[int, Type] = {}
        self.complete: dict[int, Type] = {}  # id -> type, for types without an IncompleteType
        # id -> (type, its resolution) where that is complete: it stays so whatever is unified later
        self.solved: dict[int, tuple[Type, Type]] = {}

    def find(self, t: Type) -> Type:
        """The representative of `t`'s class (itself unless it is a solved IncompleteType)."""
        seen = []
        cur = t
        while isinstance(cur, IncompleteType) and id(cur) in self.parent:
            seen.append(cur)
            cur = self.parent[id(cur)]
        for x in seen:  # path compression
            self.parent[id(x)] = cur
        return cur

    def is_complete(self, t: Type) -> bool:
        """Whether `t` (resolved) contains no IncompleteType."""
        return id(t) in self.complete

    def _kids(self, t: Type) -> list[Type]:
        if isinstance(t, IncompleteType):
            root = self.find(t)
            return [] if isinstance(root, IncompleteType) else [root]
        if isinstance(t, TupleType):
            return list(t.fields)
        if isinstance(t, FuncType):
            return [*t.arg_types, t.ret_type]
        return []

    def resolve(self, t: Type) -> Type:
        """`t` with every solved IncompleteType replaced by its solution."""
        known = self.complete
        if id(t) in known:
            return t
        if isinstance(t, IncompleteType):  # the common case: a solved var whose solution is complete
            root = self.find(t)
            if isinstance(root, IncompleteType) or id(root) in known:
                return root
        done: dict[int, Type] = {}
        stack: list[tuple[Type, bool]] = [(t, False)]
        solved = self.solved
        while stack:
            x, ready = stack.pop()
            if id(x) in known:
                done[id(x)] = x
                continue
            if id(x) in solved:
                done[id(x)] = solved[id(x)][1]
                continue
            if not ready and id(x) in done:
                continue
            kids = self._kids(x)
            todo = [k for k in kids if id(k) not in done and id(k) not in known and id(k) not in solved]
            if not ready and todo:
                stack.append((x, True))
                stack.extend((k, False) for k in reversed(todo))
                continue
            new = [done[id(k)] if id(k) in done else solved[id(k)][1] if id(k) in solved else k for k in kids]
            same = all(a is b for a, b in zip(new, kids, strict=True))
            out: Type
            if isinstance(x, IncompleteType):
                out = new[0] if new else self.find(x)
            elif isinstance(x, TupleType):
                out = x if same else TupleType(tuple(new))
            elif isinstance(x, FuncType):
                out = x if same else FuncType(new[:-1], new[-1], x.type_params)
            else:
                out = x
            done[id(x)] = out
            if isinstance(out, (TupleType, FuncType)):
                if all(id(k) in known for k in self._kids(out)):
                    known[id(out)] = out
            elif not isinstance(out, IncompleteType) and is_complete(out):
                known[id(out)] = out
            if out is not x and id(out) in known:
                solved[id(x)] = (x, out)
        return done[id(t)]

    def unify(self, a: Type, b: Type) -> Type:
        """Makes `a` and `b` the same type; raises _UnifyError saying how they differ."""
        results: list[Type] = []
        # work items: ("pair", a, b) unifies two types; ("tuple", n) / ("func", n) rebuild from n results
        work: list[tuple[str, Any, Any]] = [("pair", a, b)]
        while work:
            kind, x, y = work.pop()
            if kind == "tuple":
                fields = results[len(results) - x:]
                del results[len(results) - x:]
                results.append(TupleType(fields))
                continue
            if kind == "func":
                parts = results[len(results) - x:]
                del results[len(results) - x:]
                results.append(FuncType(parts[:-1], parts[-1]))
                continue
            x, y = self.find(x), self.find(y)
            if x is y:
                results.append(x)
            elif isinstance(x, IncompleteType):
                self.parent[id(x)] = y
                results.append(y)
            elif isinstance(y, IncompleteType):
                self.parent[id(y)] = x
                results.append(x)
            elif isinstance(x, TensorType) and isinstance(y, TensorType):
                if x.dtype != y.dtype:
                    raise _UnifyError(f"expected dtype {x.dtype}, found {y.dtype}")
                if len(x.shape) != len(y.shape):
                    raise _UnifyError(f"expected {x}, found {y} (rank {len(x.shape)} against {len(y.shape)})")
                dims = [_unify_dim(p, q, x, y) for p, q in zip(x.shape, y.shape, strict=True)]
                results.append(x if dims == list(x.shape) else TensorType(tuple(dims), x.dtype))
            elif isinstance(x, TupleType) and isinstance(y, TupleType):
                if len(x.fields) != len(y.fields):
                    raise _UnifyError(f"expected a tuple of {len(x.fields)}, found one of {len(y.fields)}")
                work.append(("tuple", len(x.fields), None))
                work.extend(("pair", p, q) for p, q in reversed(list(zip(x.fields, y.fields, strict=True))))
            elif isinstance(x, FuncType) and isinstance(y, FuncType):
                if len(x.arg_types) != len(y.arg_types):
                    raise _UnifyError(
                        f"expected a function of {len(x.arg_types)} arguments, found {len(y.arg_types)}"
                    )
                pairs = [*zip(x.arg_types, y.arg_types, strict=True), (x.ret_type, y.ret_type)]
                work.append(("func", len(pairs), None))
                work.extend(("pair", p, q) for p, q in reversed(pairs))
            elif x == y:
                results.append(x)
            else:
                raise _UnifyError(f"expected {x}, found {y}")
        return results[0]


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
            if not self.solver.is_complete(t):
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
