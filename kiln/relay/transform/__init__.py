"""Relay passes. `InferType` types every function; the others are the optimizations relay.build runs.

| pass | opt level | what it does |
| --- | --- | --- |
| InferType | 0 | sets `checked_type` on every expression |
| ToGraphNormalForm | 0 | inlines let bindings as shared graph values (graph_normal_form.py) |
| SimplifyInference | 0 | batch_norm into arithmetic, dropout into the identity (layer_norm stays one op) |
| FoldConstant | 2 | evaluates calls whose arguments are all constants |
| EliminateCommonSubexpr | 3 | merges structurally equal calls |
| DeadCodeElimination | 1 | removes unused let bindings and untaken constant branches |
| FoldScaleAxis | 3 | folds a per-channel scale after conv2d / dense into the weight |
| AlterOpLayout | 3 | rewrites calls into the form their target's fast implementation reads (FAlterOpLayout[kind]) |
| FuseOps | 1 | groups calls into primitive functions by TOpPattern (fuse_ops.py; `fusion_report` says why) |

`gradient(func)` (gradient.py) is a function transform, not a pipeline pass: it returns the function of
`func`'s result and its parameters' gradients (reverse mode, from each op's FPrimalGradient).

Every pass leaves the module typed, and runs under `PassContext(verify=True)`.
"""

from __future__ import annotations

from kiln.ir.transform import ModulePass, register_pass_factory
from kiln.relay.transform._common import infer_module, relay_pass, verify


def InferType() -> ModulePass:
    """The pass that sets `checked_type` on every expression of every function."""
    return relay_pass(infer_module, "InferType", 0)


register_pass_factory("InferType", InferType)

# The optimization passes (imported after InferType exists: they require it by name).
from kiln.relay.transform.alter_op_layout import AlterOpLayout
from kiln.relay.transform.cse import EliminateCommonSubexpr
from kiln.relay.transform.dce import DeadCodeElimination
from kiln.relay.transform.fold_constant import FoldConstant
from kiln.relay.transform.fold_scale_axis import FoldScaleAxis
from kiln.relay.transform.fuse_ops import FuseOps
from kiln.relay.transform.fusion_report import FusionReport, fusion_report
from kiln.relay.transform.gradient import GradientError, gradient
from kiln.relay.transform.graph_normal_form import ToGraphNormalForm
from kiln.relay.transform.simplify_inference import SimplifyInference

for _name, _factory in (
    ("SimplifyInference", SimplifyInference),
    ("ToGraphNormalForm", ToGraphNormalForm),
    ("FoldConstant", FoldConstant),
    ("EliminateCommonSubexpr", EliminateCommonSubexpr),
    ("DeadCodeElimination", DeadCodeElimination),
    ("FoldScaleAxis", FoldScaleAxis),
    ("AlterOpLayout", AlterOpLayout),
):
    register_pass_factory(_name, _factory)

__all__ = [
    "AlterOpLayout",
    "DeadCodeElimination",
    "EliminateCommonSubexpr",
    "FoldConstant",
    "FoldScaleAxis",
    "FuseOps",
    "FusionReport",
    "GradientError",
    "InferType",
    "SimplifyInference",
    "ToGraphNormalForm",
    "fusion_report",
    "gradient",
    "verify",
]
