"""FuseOps: groups the calls of each function into primitive functions, as TVM's FuseOps does.

The pass works in three steps, each a loop over an explicit list (no recursion
per node, so a chain of 10,000 calls fuses):

1. `ForwardGraph.build` lists the dataflow nodes of the function body in post
   order (children first) with, for each node, its fusion pattern (the op's
   `TOpPattern`; TUPLE for tuples; INJECTIVE for a field access; OPAQUE for
   anything else) and its consumers, each edge carrying a pattern. A node whose
   value also leaves the dataflow (the function result, a let, an if, a call of
   a function value) is marked `extern_ref`: it cannot fuse into a consumer.
2. `post_dominators` computes the post-dominator tree: a node's parent is the
   least common ancestor, in the tree, of all its consumers (TVM's
   `DominatorTree::PostDom`), and the combined pattern of the edges on the way.
3. `partition` merges each node into the group of its post-dominator when the
   patterns allow it (TVM's `GraphPartitioner`, three phases: out-elemwise-fusable
   and elementwise ops first, injective ops second, injective ops into tuples
   third), within `relay.FuseOps.max_depth` ops per group.

Each group then becomes `Function(params, body, ret_type, {"Primitive": 1})`,
called from where its root (the node whose value leaves the group) was; the
parameters are the values the group reads from outside it. Constants stay
inside the group that uses them (the lowering makes them extra inputs).
"""

from __future__ import annotations

from collections.abc import Callable

from kiln.ir import graph
from kiln.ir.module import IRModule
from kiln.ir.transform import ModulePass, PassContext, PassError, register_config
from kiln.ir.types import TensorType, TupleType, Type
from kiln.registry import Op, OpPattern, attr
from kiln.relay.expr import (
    Call,
    Constant,
    Expr,
    Function,
    If,
    Let,
    Tuple,
    TupleGetItem,
    Var,
)
from kiln.relay.transform._common import relay_pass
from kiln.relay.type_infer import infer_type

MAX_DEPTH_KEY = "relay.FuseOps.max_depth"
DEFAULT_MAX_DEPTH = 256
register_config(MAX_DEPTH_KEY, int, "the most ops FuseOps puts in one group (default 256)")

_ELEMWISE, _BROADCAST, _INJECTIVE = OpPattern.ELEMWISE, OpPattern.BROADCAST, OpPattern.INJECTIVE
_REDUCE, _OUT_EWISE = OpPattern.COMM_REDUCE, OpPattern.OUT_ELEMWISE_FUSABLE
_TUPLE, _OPAQUE = OpPattern.TUPLE, OpPattern.OPAQUE

_TUPLE_REASON = "its post-dominator is a tuple, and fields join a tuple only once it has fused into an injective op"
PATTERN_NAMES = {
    _ELEMWISE: "elemwise",
    _BROADCAST: "broadcast",
    _INJECTIVE: "injective",
    _REDUCE: "comm-reduce",
    _OUT_EWISE: "out-elemwise-fusable",
    _TUPLE: "tuple",
    _OPAQUE: "opaque",
}


# ---------------------------------------------------------------------------
# The dataflow graph
# ---------------------------------------------------------------------------


class GraphNode:
    """One expression of the dataflow graph (TVM's IndexedForwardGraph::Node)."""

    __slots__ = ("expr", "extern_ref", "index", "outputs", "pattern")

    def __init__(self, expr: Expr, index: int) -> None:
        self.expr = expr
        self.index = index
        self.pattern = _OPAQUE
        self.extern_ref = False
        self.outputs: list[tuple[int, OpPattern]] = []  # (consumer index, edge pattern)


def _operands(node: Expr) -> tuple[Expr, ...]:
    """The children the graph walks into: not into primitive functions (already fused)."""
    if isinstance(node, Function) and node.is_primitive:
        return ()
    return node.children()


def _post_order(root: Expr) -> list[Expr]:
    return graph.post_order([root], _operands)


def _is_tensor(e: Expr) -> bool:
    return e.has_type and isinstance(e.checked_type, TensorType)


def _shape(e: Expr) -> tuple[object, ...] | None:
    t = e.checked_type if e.has_type else None
    return tuple(t.shape) if isinstance(t, TensorType) else None


def op_pattern(op: Op) -> OpPattern:
    """The op's TOpPattern (OPAQUE when it has none)."""
    return OpPattern(op.get_attr(attr.TOpPattern, _OPAQUE))


class ForwardGraph:
    """The dataflow graph of an expression, nodes in post order (TVM's IndexedForwardGraph)."""

    def __init__(self, nodes: list[GraphNode], index: dict[int, int]) -> None:
        self.nodes = nodes
        self.index = index

    @staticmethod
    def build(body: Expr) -> ForwardGraph:
        """The graph of `body` (typed by InferType); `body` itself is an external reference."""
        exprs = _post_order(body)
        index = {id(e): i for i, e in enumerate(exprs)}
        nodes = [GraphNode(e, i) for i, e in enumerate(exprs)]

        def link(child: Expr, parent: GraphNode | None, pattern: OpPattern) -> None:
            if parent is None:
                nodes[index[id(child)]].extern_ref = True
            else:
                nodes[index[id(child)]].outputs.append((parent.index, pattern))

        for node in nodes:
            e = node.expr
            if isinstance(e, Call) and isinstance(e.op, Op):
                node.pattern = op_pattern(e.op)
                out_shape = _shape(e)
                for arg in e.args:
                    edge = node.pattern
                    # a broadcast op reads an input of its own shape elementwise
                    if edge == _BROADCAST and out_shape is not None and _shape(arg) == out_shape:
                        edge = _ELEMWISE
                    link(arg, node, edge)
            elif isinstance(e, Call):  # a call of a function value: opaque, and the callee leaves the dataflow
                link(e.children()[0], None, _OPAQUE)
                for arg in e.args:
                    link(arg, node, _OPAQUE)
            elif isinstance(e, Tuple):
                node.pattern = _TUPLE
                for field in e.fields:
                    link(field, node if _is_tensor(field) else None, _INJECTIVE)
            elif isinstance(e, TupleGetItem):
                t = e.tuple_value.checked_type if e.tuple_value.has_type else None
                if isinstance(t, TupleType) and all(isinstance(f, TensorType) for f in t.fields):
                    node.pattern = _INJECTIVE
                    link(e.tuple_value, node, _INJECTIVE)
                else:
                    link(e.tuple_value, None, _OPAQUE)
            else:  # lets, ifs, functions: fusion never crosses them
                for child in _operands(e):
                    link(child, None, _OPAQUE)
        nodes[index[id(body)]].extern_ref = True
        return ForwardGraph(nodes, index)


# ---------------------------------------------------------------------------
# The post-dominator tree
# ---------------------------------------------------------------------------


class PostDomTree:
    """For each node: its immediate post-dominator (-1 if none), depth, and the combined edge pattern."""

    def __init__(self, graph: ForwardGraph) -> None:
        n = len(graph.nodes)
        self.parent = [-1] * n
        self.depth = [1] * n
        self.pattern = [_OPAQUE] * n
        for i in range(n - 1, -1, -1):  # consumers come after producers in post order
            node = graph.nodes[i]
            if node.extern_ref:
                continue
            pattern = _ELEMWISE
            parent = -1
            for k, (out, edge) in enumerate(node.outputs):
                parent, pattern = (out, pattern) if k == 0 else self._lca(parent, out, pattern)
                pattern = max(pattern, edge)
                if parent == -1:
                    break
            self.parent[i] = parent
            self.depth[i] = self.depth[parent] + 1 if parent >= 0 else 1
            self.pattern[i] = pattern

    def _lca(self, a: int, b: int, pattern: OpPattern) -> tuple[int, OpPattern]:
        depth, parent, patterns = self.depth, self.parent, self.pattern
        while a != b:
            if a < 0 or b < 0:
                return -1, pattern
            if depth[a] < depth[b]:
                pattern, b = max(pattern, patterns[b]), parent[b]
            elif depth[b] < depth[a]:
                pattern, a = max(pattern, patterns[a]), parent[a]
            else:
                pattern = max(pattern, patterns[a], patterns[b])
                a, b = parent[a], parent[b]
        return a, pattern


# ---------------------------------------------------------------------------
# The partition
# ---------------------------------------------------------------------------


def label(e: Expr) -> str:
    """How a node is named in reports: the op name, `tuple`, `tuple.N`, or the kind of expression."""
    if isinstance(e, Call):
        return e.op.name if isinstance(e.op, Op) else "call"
    if isinstance(e, Tuple):
        return "tuple"
    if isinstance(e, TupleGetItem):
        return f"tuple.{e.index}"
    return type(e).__name__.lower()


def is_op_call(e: Expr) -> bool:
    """Whether `e` is a call of an op (what a group's size counts)."""
    return isinstance(e, Call) and isinstance(e.op, Op)


class Partition:
    """Union-find over graph nodes (TVM's GraphPartitioner), with why each node stopped fusing.

    `reasons[i]` says why node `i` was not merged into its post-dominator's group;
    only group roots with consumers outside their group keep a meaningful one.
    """

    def __init__(self, graph: ForwardGraph, opt_level: int, max_depth: int) -> None:
        self.graph = graph
        self.max_depth = max_depth
        nodes = graph.nodes
        self.parent = list(range(len(nodes)))
        self.pattern = [n.pattern for n in nodes]
        self.anchor: list[int] = [i if n.pattern == _OUT_EWISE else -1 for i, n in enumerate(nodes)]
        self.num_ops = [1 if is_op_call(n.expr) else 0 for n in nodes]
        self.reasons: dict[int, str] = {}
        if opt_level > 0:
            tree = PostDomTree(graph)
            for phase in range(3):
                self._run(tree, phase)

    def find(self, i: int) -> int:
        """The index of the root group of node `i`."""
        root = i
        while self.parent[root] != root:
            root = self.parent[root]
        while self.parent[i] != root:
            self.parent[i], i = root, self.parent[i]
        return root

    def _between(self, src: int, sink: int) -> list[int]:
        """The nodes on the paths from `src`'s consumers to `sink` (the sink included, once)."""
        seen: set[int] = set()
        out: list[int] = []
        stack = [o for o, _ in reversed(self.graph.nodes[src].outputs)]
        while stack:
            i = stack.pop()
            if i in seen:
                continue
            seen.add(i)
            out.append(i)
            if i != sink:
                stack.extend(o for o, _ in reversed(self.graph.nodes[i].outputs))
        return out

    def _check_path(self, src: int, sink: int, cond: Callable[[OpPattern, bool], bool]) -> int:
        """The first node between `src` and `sink` whose group fails `cond`, or -1 when all pass."""
        for i in self._between(src, sink):
            if not cond(self.pattern[self.find(i)], i == sink):
                return i
        return -1

    def _merge(self, child: int, parent: int) -> None:
        child, parent = self.find(child), self.find(parent)
        if child == parent:
            return
        self.num_ops[parent] += self.num_ops[child]
        self.parent[child] = parent
        if self.anchor[child] >= 0:
            self.anchor[parent] = self.anchor[child]
            self.pattern[parent] = max(self.pattern[parent], self.pattern[child])

    def _commit(self, src: int, sink: int) -> None:
        target = sink
        self._merge(src, target)
        for i in self._between(src, sink):
            if i != sink:
                self._merge(i, target)

    def _size_with(self, child: int, sink: int) -> int:
        target = self.find(sink)
        roots = {self.find(i) for i in [child, *self._between(child, sink)] if i != sink} - {target}
        return self.num_ops[target] + sum(self.num_ops[r] for r in roots)

    def _name(self, i: int) -> str:
        e = self.graph.nodes[i].expr
        return f"{label(e)} ({PATTERN_NAMES[self.graph.nodes[i].pattern]})"

    def _run(self, tree: PostDomTree, phase: int) -> None:
        nodes = self.graph.nodes
        for i, node in enumerate(nodes):
            pattern = self.pattern[self.find(i)]
            dom = tree.parent[i]
            if pattern == _OPAQUE:
                self.reasons[i] = "an opaque op never fuses"
                continue
            if dom < 0:
                if node.extern_ref:
                    self.reasons[i] = "its value also leaves the dataflow (a let, an if, or the function result)"
                elif len(node.outputs) > 1:
                    self.reasons[i] = "the producer has several consumers not post-dominated by one group"
                continue
            if self.find(i) == self.find(dom) and phase < 2:
                continue
            sized = phase < 2 or (pattern <= _INJECTIVE and nodes[dom].pattern == _TUPLE)
            if sized and self._size_with(i, dom) > self.max_depth:
                self.reasons[i] = f"max group size {self.max_depth} reached"
                continue
            if phase == 2:
                self._phase2(i, dom, pattern)
            elif nodes[dom].pattern == _TUPLE:  # the group of the node itself, as TVM checks it
                self.reasons[i] = _TUPLE_REASON
            elif pattern == _OUT_EWISE:
                if phase == 0:
                    self._fuse_out_ewise(i, dom, tree.pattern[i])
            elif pattern <= _BROADCAST:
                self._fuse_elemwise(i, dom, tree.pattern[i])
            elif pattern in (_INJECTIVE, _TUPLE):
                if phase == 1:  # after phase 0, so that conv2d and friends finish fusing first
                    self._try(i, dom, lambda k, sink: k <= _INJECTIVE, "an injective op fuses only into injective ops")
            else:
                self.reasons[i] = "a reduction fuses with its elementwise inputs, never with its consumers"

    def _try(self, i: int, dom: int, cond: Callable[[OpPattern, bool], bool], why: str) -> bool:
        bad = self._check_path(i, dom, cond)
        if bad < 0:
            self._commit(i, dom)
            return True
        self.reasons[i] = f"{why}; {self._where(dom, bad)}"
        return False

    def _where(self, dom: int, bad: int) -> str:
        if bad == dom:
            return f"its post-dominator is {self._name(dom)}"
        return f"the way to its post-dominator {label(self.graph.nodes[dom].expr)} passes through {self._name(bad)}"

    def _edge_culprit(self, i: int, dom: int, edge: OpPattern) -> str:
        """Says which consumer made the combined edge pattern to the post-dominator `edge`."""
        found = [k for k in self._between(i, dom) if self.graph.nodes[k].pattern == edge]
        culprit = dom if not found or dom in found else found[0]
        return self._where(dom, culprit)

    def _fuse_out_ewise(self, i: int, dom: int, edge: OpPattern) -> None:
        anchor = label(self.graph.nodes[self.anchor[self.find(i)]].expr)
        why = f"a group with an out-elemwise-fusable op ({anchor}) fuses only with elementwise/broadcast ops after it"
        if edge != _ELEMWISE:
            self.reasons[i] = f"{why}; {self._edge_culprit(i, dom, edge)}"
            return
        self._try(i, dom, lambda k, sink: k <= _BROADCAST, why)

    def _fuse_elemwise(self, i: int, dom: int, edge: OpPattern) -> None:
        why = "an elementwise/broadcast op fuses only into elementwise, injective or reduction consumers"
        if not (edge <= _INJECTIVE or edge == _REDUCE):
            self.reasons[i] = f"{why}; {self._edge_culprit(i, dom, edge)}"
            return

        def cond(kind: OpPattern, is_sink: bool) -> bool:
            # ops on parallel branches may be injective; the sink may already hold an out-elemwise-fusable op
            return kind <= _INJECTIVE or (is_sink and kind in (_REDUCE, _OUT_EWISE))

        self._try(i, dom, cond, why)

    def _phase2(self, i: int, dom: int, pattern: OpPattern) -> None:
        """Fuses injective ops into a tuple that has fused into an injective consumer (concatenate's inputs)."""
        if pattern > _INJECTIVE or self.graph.nodes[dom].pattern != _TUPLE:
            return
        root = self.pattern[self.find(dom)]
        if root == _TUPLE:
            self.reasons[i] = _TUPLE_REASON
        elif root <= _INJECTIVE and self.find(i) != self.find(dom):
            self._try(i, dom, lambda k, sink: k <= _INJECTIVE, "tuple fields fuse only through injective ops")


def read_max_depth(ctx: PassContext, max_depth: int | None = None) -> int:
    """The group size limit: `max_depth`, else the context's `relay.FuseOps.max_depth`, else 256."""
    value = max_depth if max_depth is not None else ctx.config.get(MAX_DEPTH_KEY, DEFAULT_MAX_DEPTH)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise PassError(f"{MAX_DEPTH_KEY} must be an int >= 1, got {value!r}")
    return value


# ---------------------------------------------------------------------------
# Rewriting groups into primitive functions
# ---------------------------------------------------------------------------


class _Group:
    __slots__ = ("arguments", "by_value", "params")

    def __init__(self) -> None:
        self.params: list[Var] = []
        self.arguments: list[Expr] = []
        self.by_value: dict[int, Var] = {}

    def param_for(self, value: Expr, t: Type) -> Var:
        found = self.by_value.get(id(value))
        if found is None:
            found = self.by_value[id(value)] = Var(f"p{len(self.params)}", t)
            self.params.append(found)
            self.arguments.append(value)
        return found


def _rewrite(body: Expr, part: Partition) -> Expr:
    """`body` with each group turned into a call of a primitive function (TVM's FuseMutator)."""
    graph = part.graph
    new: list[Expr] = []
    groups: dict[int, _Group] = {}

    def args_in(values: tuple[Expr, ...], group: int) -> tuple[Expr, ...]:
        out: list[Expr] = []
        for v in values:
            j = graph.index[id(v)]
            if isinstance(v, Constant) or part.find(j) == group:
                out.append(v if isinstance(v, Constant) else new[j])
            else:
                out.append(groups.setdefault(group, _Group()).param_for(new[j], v.checked_type))
        return tuple(out)

    def make_function(group: int, root: Expr, inner: Expr) -> Expr:
        info = groups.pop(group, None) or _Group()
        func = Function(info.params, inner, root.checked_type, {"Primitive": 1}, span=root.span)
        return Call(func, info.arguments, span=root.span)

    for i, node in enumerate(graph.nodes):
        e = node.expr
        n = [new[graph.index[id(c)]] for c in _operands(e)]
        group = part.find(i)
        is_root = group == i  # the union-find root is the node whose value leaves the group
        if isinstance(e, Call) and isinstance(e.op, Op):
            inner: Expr = Call(e.op, args_in(e.args, group), e.attrs, span=e.span)
            new.append(make_function(group, e, inner) if is_root else inner)
        elif isinstance(e, Tuple):
            new.append(Tuple(n, span=e.span) if is_root else Tuple(args_in(e.fields, group), span=e.span))
        elif isinstance(e, TupleGetItem):
            j = graph.index[id(e.tuple_value)]
            if is_root and part.find(j) != group:  # a lone field access: nothing to fuse
                new.append(TupleGetItem(new[j], e.index, span=e.span))
            else:
                inner = TupleGetItem(args_in((e.tuple_value,), group)[0], e.index, span=e.span)
                new.append(make_function(group, e, inner) if is_root else inner)
        elif isinstance(e, Call):
            new.append(Call(n[0], n[1:], e.attrs, span=e.span))
        elif isinstance(e, Let):
            var = n[0]
            assert isinstance(var, Var)
            new.append(Let(var, n[1], n[2], span=e.span))
        elif isinstance(e, If):
            new.append(If(n[0], n[1], n[2], span=e.span))
        elif isinstance(e, Function) and not e.is_primitive:
            new.append(Function(e.params, n[-1], e.ret_type, e.attrs, span=e.span))
        else:  # Var, GlobalVar, Constant, primitive Function
            new.append(e)
    return new[graph.index[id(body)]]


def fuse_function(func: Function, opt_level: int, max_depth: int) -> Function:
    """`func` (typed) with its calls grouped into primitive functions."""
    part = Partition(ForwardGraph.build(func.body), opt_level, max_depth)
    return Function(func.params, _rewrite(func.body, part), func.ret_type, func.attrs, span=func.span)


def _typed(mod: IRModule) -> None:
    for name in mod:
        func = mod[name]
        if isinstance(func, Expr):
            infer_type(func, mod)


def FuseOps(fuse_opt_level: int = -1) -> ModulePass:
    """The pass that fuses calls into primitive functions, by their ops' TOpPattern.

    Args:
        fuse_opt_level: 0 puts every op in its own group; -1 takes the PassContext's opt level.

    Returns:
        A module pass (opt level 1). The group size limit is the PassContext config
        `relay.FuseOps.max_depth` (default 256 ops). The result is type-checked.
    """

    def run(mod: IRModule, ctx: PassContext) -> IRModule:
        level = ctx.opt_level if fuse_opt_level == -1 else fuse_opt_level
        max_depth = read_max_depth(ctx)
        _typed(mod)
        out = mod.copy()
        for gvar, func in mod.items():
            if isinstance(func, Function) and not func.is_primitive:
                out[gvar] = fuse_function(func, level, max_depth)
        _typed(out)
        return out

    return relay_pass(run, "FuseOps", 1)


__all__ = ["DEFAULT_MAX_DEPTH", "MAX_DEPTH_KEY", "ForwardGraph", "FuseOps", "Partition", "PostDomTree", "fuse_function"]
