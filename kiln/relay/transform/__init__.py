"""Relay passes. `InferType` types every function; the others are the optimizations relay.build runs.

| pass | opt level | what it does |
| --- | --- | --- |
| InferType | 0 | sets `checked_type` on every expression |
| ToGraphNormalForm | 0 | inlines let bindings as shared graph values (graph_normal_form.py) |
| SimplifyInference | 0 | batch_norm / layer_norm into arithmetic, dropout into the identity |
| FoldConstant | 2 | evaluates calls whose arguments are all constants |
| EliminateCommonSubexpr | 3 | merges structurally equal calls |
| DeadCodeElimination | 1 | removes unused let bindings and untaken constant branches |
| FoldScaleAxis | 3 | folds a per-channel scale after conv2d / dense into the weight |
| FuseOps | 1 | groups calls into primitive functions by TOpPattern (fuse_ops.py) |

Every pass leaves the module typed, and runs under `PassContext(verify=True)`.
"""

from __future__ import annotations

from kiln.ir.module import IRModule
from kiln.ir.transform import ModulePass, PassContext, PassInfo, register_pass_factory
from kiln.relay.analysis import check_well_formed
from kiln.relay.expr import Expr
from kiln.relay.type_infer import TypeInferenceError, infer_type


def _infer_module(mod: IRModule, ctx: PassContext | None = None) -> IRModule:
    for name in mod:
        func = mod[name]
        try:
            infer_type(func, mod)
        except TypeInferenceError as err:
            raise TypeInferenceError(err.diagnostics, func, f" in @{name}") from None
    return mod


def InferType() -> ModulePass:
    """The pass that sets `checked_type` on every expression of every function."""
    return ModulePass(_infer_module, PassInfo("InferType", 0))


def verify(mod: IRModule) -> None:
    """Checks every function is well formed (no var bound twice, no free vars) and well typed."""
    for name in mod:
        func = mod[name]
        if isinstance(func, Expr):
            check_well_formed(func, is_global=True)
    _infer_module(mod)


register_pass_factory("InferType", InferType)
PassContext.verifier = verify

# The optimization passes (imported after InferType exists: they require it by name).
from kiln.relay.transform.cse import EliminateCommonSubexpr
from kiln.relay.transform.dce import DeadCodeElimination
from kiln.relay.transform.fold_constant import FoldConstant
from kiln.relay.transform.fold_scale_axis import FoldScaleAxis
from kiln.relay.transform.fuse_ops import FuseOps
from kiln.relay.transform.graph_normal_form import ToGraphNormalForm
from kiln.relay.transform.simplify_inference import SimplifyInference

for _name, _factory in (
    ("SimplifyInference", SimplifyInference),
    ("ToGraphNormalForm", ToGraphNormalForm),
    ("FoldConstant", FoldConstant),
    ("EliminateCommonSubexpr", EliminateCommonSubexpr),
    ("DeadCodeElimination", DeadCodeElimination),
    ("FoldScaleAxis", FoldScaleAxis),
):
    register_pass_factory(_name, _factory)

__all__ = [
    "DeadCodeElimination",
    "EliminateCommonSubexpr",
    "FoldConstant",
    "FoldScaleAxis",
    "FuseOps",
    "InferType",
    "SimplifyInference",
    "ToGraphNormalForm",
    "verify",
]
