"""The op library: each family module declares its ops, one `register_op` chain per op, and their constructors."""

from kiln.relay.op import conv, image, indexing, matmul, nn, norm, pool, reduce, shape, tensor

__all__ = ["conv", "image", "indexing", "matmul", "nn", "norm", "pool", "reduce", "shape", "tensor"]
