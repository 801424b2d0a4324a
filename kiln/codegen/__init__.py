"""Code generation: loop IR to LLVM machine code and to CUDA C.

`llvm` turns a PrimFunc into LLVM IR, `llvm_math` supplies vectorizable math,
`jit` optimizes it and emits object code (in a child process), `cuda` and
`cuda_host` turn a PrimFunc into CUDA C and its launch table, `nvrtc` compiles
that to a CUBIN, `cache` keeps compiled kernels. `backends` puts them together
and sets each as its target kind's `FBuild`: importing this package is what
makes the back ends known to `kiln.build` and `relay.build`.
"""

from kiln.codegen import backends
from kiln.codegen.jit import CodegenError

__all__ = ["CodegenError", "backends"]
