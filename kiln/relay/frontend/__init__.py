"""Frontends: importers that turn models of other frameworks into Relay modules.

`relay.frontend.from_onnx(model)` imports an ONNX model (`kiln.relay.frontend.onnx`);
`@onnx_converter` registers a converter for an ONNX op kiln does not know.
"""

from kiln.relay.frontend.onnx import (
    OnnxImportError,
    OnnxNode,
    OnnxUnsupportedError,
    from_onnx,
    onnx_converter,
)

__all__ = ["OnnxImportError", "OnnxNode", "OnnxUnsupportedError", "from_onnx", "onnx_converter"]
