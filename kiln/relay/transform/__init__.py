"""Relay passes. `InferType` types every function; the other passes come with relay.build."""

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
