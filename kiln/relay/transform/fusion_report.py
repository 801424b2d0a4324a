"""Why FuseOps groups a function's calls as it does: the groups, and the reason at each boundary.

```python
print(relay.transform.fusion_report(mod))
# fusion of @main: 2 groups (max group size 256)
#   group 0 [out-elemwise-fusable]: nn.conv2d, nn.bias_add, nn.relu
#   group 1 [opaque]: nn.softmax
# boundaries:
#   group 0 -> group 1: nn.relu (elemwise) → nn.softmax (opaque): an opaque op never fuses
```

The report runs the same partition as the pass (`kiln.relay.transform.fuse_ops`),
on the module before fusion, under the current PassContext's opt level and
`relay.FuseOps.max_depth`.
"""

from __future__ import annotations

import attrs

from kiln.ir.module import IRModule
from kiln.ir.transform import PassContext
from kiln.registry import Op, OpPattern
from kiln.relay.expr import Call, Expr, Function, Tuple, TupleGetItem
from kiln.relay.transform.fuse_ops import (
    PATTERN_NAMES,
    ForwardGraph,
    Partition,
    is_op_call,
    label,
    read_max_depth,
)
from kiln.relay.type_infer import infer_type


@attrs.frozen
class FusionGroup:
    """One group: its number, its pattern, and its ops (`tuple`, `tuple.N` for tuples), in post order.

    `primitive` says whether the pass makes it a primitive function: a group
    with no op call (a lone tuple or field access) stays in the caller.
    """

    index: int
    pattern: OpPattern
    ops: tuple[str, ...]
    primitive: bool = True

    def __str__(self) -> str:
        where = "" if self.primitive else " (no op: stays in the caller)"
        return f"group {self.index} [{PATTERN_NAMES[self.pattern]}]: {', '.join(self.ops)}{where}"


@attrs.frozen
class FusionBoundary:
    """An edge from a node of one group to a node of another, and why they were not fused."""

    producer_group: int
    consumer_group: int
    producer: str  # "nn.conv2d (out-elemwise-fusable)"
    consumer: str
    reason: str

    def __str__(self) -> str:
        return (
            f"group {self.producer_group} -> group {self.consumer_group}: "
            f"{self.producer} → {self.consumer}: {self.reason}"
        )


@attrs.frozen
class FusionReport:
    """The groups of one function, in post order of their first op, and the boundaries between them."""

    function: str
    max_depth: int
    groups: tuple[FusionGroup, ...]
    boundaries: tuple[FusionBoundary, ...]

    def __str__(self) -> str:
        n = len(self.groups)
        lines = [f"fusion of @{self.function}: {n} group{'s' * (n != 1)} (max group size {self.max_depth})"]
        lines.extend(f"  {g}" for g in self.groups)
        lines.append("boundaries:" if self.boundaries else "boundaries: none")
        lines.extend(f"  {b}" for b in self.boundaries)
        return "\n".join(lines)


def _in_group(e: Expr) -> bool:
    return isinstance(e, Tuple | TupleGetItem) or (isinstance(e, Call) and isinstance(e.op, Op))


def fusion_report(mod: IRModule | Function, function: str = "main", max_depth: int | None = None) -> FusionReport:
    """How FuseOps would group the calls of one function of `mod`, and why fusion stops at each boundary.

    Args:
        mod: the module before fusion (or a Function); it is type-checked first.
        function: the name of the function to report on.
        max_depth: the group size limit; by default the PassContext's `relay.FuseOps.max_depth` (256).

    Returns:
        A FusionReport: `groups` (ops of each group, in order) and `boundaries`
        (each edge between two groups with its reason); `str()` renders both.
    """
    ctx = PassContext.current()
    if isinstance(mod, Function):
        mod = IRModule.from_expr(mod)
    func = mod[function]
    if not isinstance(func, Function):
        raise TypeError(f"@{function} is a {type(func).__name__}, not a Function")
    infer_type(func, mod)
    limit = read_max_depth(ctx, max_depth)
    graph = ForwardGraph.build(func.body)
    part = Partition(graph, ctx.opt_level, limit)
    number: dict[int, int] = {}  # root node -> group number
    members: dict[int, list[str]] = {}
    has_op: set[int] = set()
    for i, node in enumerate(graph.nodes):
        if _in_group(node.expr):
            root = part.find(i)
            number.setdefault(root, len(number))
            members.setdefault(root, []).append(label(node.expr))
            if is_op_call(node.expr):
                has_op.add(root)
    groups = tuple(FusionGroup(number[r], part.pattern[r], tuple(members[r]), r in has_op) for r in number)
    boundaries: list[FusionBoundary] = []
    for i, node in enumerate(graph.nodes):
        if not _in_group(node.expr):
            continue
        for out, _ in node.outputs:
            src, dst = part.find(i), part.find(out)
            if src == dst or dst not in number:
                continue
            consumer = graph.nodes[out]
            if OpPattern.OPAQUE in (node.pattern, consumer.pattern):
                reason = "an opaque op never fuses"
            else:
                reason = part.reasons.get(i, "no fusion rule joins them")
            boundaries.append(
                FusionBoundary(
                    number[src],
                    number[dst],
                    f"{label(node.expr)} ({PATTERN_NAMES[node.pattern]})",
                    f"{label(consumer.expr)} ({PATTERN_NAMES[consumer.pattern]})",
                    reason,
                )
            )
    return FusionReport(function, limit, groups, tuple(boundaries))


__all__ = ["FusionBoundary", "FusionGroup", "FusionReport", "fusion_report"]
