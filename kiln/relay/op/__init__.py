"""The op library: each family module declares its ops, one `register_op` chain per op, and their constructors."""

from kiln.relay.op import (
    algorithm,
    conv,
    creation,
    image,
    indexing,
    loss,
    matmul,
    nn,
    norm,
    pool,
    quantize,
    reduce,
    shape,
    tensor,
    vision,
)
from kiln.relay.op._reg import constructor

__all__ = [
    "algorithm", "constructor", "conv", "creation", "image", "indexing", "loss", "matmul", "nn", "norm", "pool",
    "quantize", "reduce", "shape", "tensor", "vision",
]
