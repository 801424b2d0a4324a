"""Code generation: loop IR to LLVM machine code (and, later, to CUDA C).

`llvm` turns a PrimFunc into LLVM IR, `llvm_math` supplies vectorizable math,
`jit` optimizes, emits and loads machine code, `cache` keeps compiled kernels.
"""

from kiln.codegen.jit import CodegenError

__all__ = ["CodegenError"]
