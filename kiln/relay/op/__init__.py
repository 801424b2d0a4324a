"""The op library: each family module registers its ops and defines their constructors."""

from kiln.relay.op import conv, nn, reduce, tensor, transform

__all__ = ["conv", "nn", "reduce", "tensor", "transform"]
