"""ONNX models imported with relay.frontend.from_onnx: kiln beside onnxruntime on the same inputs.

For each model of `kiln.testing.onnx_models` (the CNN and the transformer
encoder block), and the CNN at batch 8, `kiln.bench.compare` compiles the
imported module, runs kiln and onnxruntime on the same random inputs and
prints both medians, the ratio (onnxruntime time / kiln time: above 1, kiln is
faster) and the largest difference between their outputs. This is what
`kiln bench model.onnx` prints.
"""

from __future__ import annotations

import sys

from kiln import bench
from kiln.relay.frontend import from_onnx
from kiln.testing import onnx_models


def main() -> int:
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        print("onnxruntime is not installed: nothing to compare with")
        return 0
    for name, model in [("cnn", onnx_models.cnn()), ("cnn batch 8", onnx_models.cnn(batch=8)),
                        ("transformer encoder block", onnx_models.transformer_encoder())]:
        print(f"== {name}")
        mod, params = from_onnx(model)
        bench.compare(model, mod, params, repeat=200)
    return 0


if __name__ == "__main__":
    sys.exit(main())
