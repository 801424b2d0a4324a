"""The IR foundation: dtypes, types, attrs, spans, diagnostics, IRModule and the pass infrastructure.

This layer knows nothing of Relay's expressions; `kiln.relay` builds on it.
"""

from kiln.ir.attrs import Attrs, AttrsError
from kiln.ir.diagnostics import Diagnostic, DiagnosticError
from kiln.ir.dtype import DataType, DTypeError
from kiln.ir.module import IRModule, ModuleError
from kiln.ir.span import Span
from kiln.ir.transform import (
    FunctionPass,
    ModulePass,
    Pass,
    PassContext,
    PassError,
    PassInfo,
    PassInstrument,
    PassTimingInstrument,
    PrintIRInstrument,
    Sequential,
    function_pass,
    module_pass,
    register_config,
)
from kiln.ir.types import (
    ANY,
    AnyDim,
    Dim,
    FuncType,
    IncompleteType,
    SizeVar,
    SymDim,
    TensorType,
    TupleType,
    Type,
    TypeVar,
)
