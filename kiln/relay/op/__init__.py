"""The op library: each family module registers its ops and defines their constructors."""

from kiln.relay.op import conv, image, indexing, matmul, nn, norm, pool, reduce, tensor, transform

__all__ = ["conv", "image", "indexing", "matmul", "nn", "norm", "pool", "reduce", "tensor", "transform"]
