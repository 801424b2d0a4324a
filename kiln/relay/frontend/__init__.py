"""Frontends: importers that turn models of other frameworks into Relay modules.

`relay.frontend.from_onnx(model)` imports an ONNX model (`kiln.relay.frontend.onnx`);
`@onnx_converter` registers a converter for an ONNX op kiln does not know;
`OnnxRunner(model)` compiles and runs a model, specializing on the inputs whose
values decide shapes.
"""

from kiln.relay.frontend.onnx import (
    OnnxImportError,
    OnnxNode,
    OnnxUnsupportedError,
    OnnxValueNeededError,
    from_onnx,
    onnx_converter,
)
from kiln.relay.frontend.onnx_runner import OnnxRunner

__all__ = [
    "OnnxImportError", "OnnxNode", "OnnxRunner", "OnnxUnsupportedError", "OnnxValueNeededError", "from_onnx",
    "onnx_converter",
]
