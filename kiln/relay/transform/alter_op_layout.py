"""AlterOpLayout: each call rewritten into the form its fast implementation for the target reads.

An op that has a faster form for a target kind sets `FAlterOpLayout[kind]`, a
function `(attrs, args, arg_types, target) -> Expr | None` (TVM's
`FTVMAlterOpLayout`). The pass calls it on every call of the op, bottom-up,
with the call's (rewritten) arguments and their types, and puts what it
returns in the call's place (None keeps the call). The typical rewrite puts a
constant weight through a layout transform and tells the op the new layout:

```
nn.dense(x, W)   ->   nn.dense(x, transpose(reshape(W, (N/64, 64, K)), (0, 2, 1)), weight_layout="NK64n")
```

FoldConstant, which relay.build runs next, evaluates the transform once at
build time, so the kernel reads a weight that is already packed instead of
packing it on every run. The target is the current one (`with target:`;
relay.build enters it); outside any target the pass does nothing. Opt level 3.
"""

from __future__ import annotations

from typing import Any

from kiln.ir.module import IRModule
from kiln.ir.transform import ModulePass
from kiln.registry import Op, attr
from kiln.relay.expr import Call, Expr, Function
from kiln.relay.transform._common import relay_pass, rewrite_module
from kiln.relay.visitor import ExprMutator
from kiln.target import Target


class _Alter(ExprMutator):
    def __init__(self, target: Target) -> None:
        super().__init__()
        self.target = target
        self.key = attr.FAlterOpLayout[target.kind.name]

    def rewrite_call(self, node: Call, op: Op | Expr, args: tuple[Expr, ...]) -> Expr:
        new = super().rewrite_call(node, op, args)
        if not isinstance(op, Op):
            return new
        alter = op.get_attr(self.key, None)
        if alter is None or not all(a.has_type for a in node.args):
            return new
        altered: Any = alter(node.attrs, list(args), [a.checked_type for a in node.args], self.target)
        return new if altered is None else altered


def _alter(func: Function, mod: IRModule) -> Expr:
    target = Target.current()
    return func if target is None else _Alter(target).visit(func)


def AlterOpLayout() -> ModulePass:
    """The pass that rewrites calls through their op's `FAlterOpLayout[kind]` for the current target."""
    return relay_pass(lambda mod, ctx: rewrite_module(mod, _alter), "AlterOpLayout", 3)

