"""The op library: each family module declares its ops, one `register_op` chain per op, and their constructors."""

from kiln.relay.op import conv, creation, image, indexing, matmul, nn, norm, pool, reduce, shape, tensor
from kiln.relay.op._reg import constructor

__all__ = [
    "constructor", "conv", "creation", "image", "indexing", "matmul", "nn", "norm", "pool", "reduce", "shape", "tensor",
]
