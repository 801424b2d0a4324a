"""Code generation: loop IR to LLVM machine code and to CUDA C.

Empty until its issue lands; DESIGN.md says what lives here.
"""
