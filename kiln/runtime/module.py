"""`Module`: a compiled kernel that numpy arrays can call.

Calling `module(*arrays)` checks every array against the kernel's buffers
before native code runs: it must be a numpy ndarray of the buffer's dtype and
ndim, match its static dims, bind its symbolic dims consistently with the
other arrays, be C-contiguous, aligned and writeable, and not overlap another
argument (the kernel's pointers are `noalias`). Any mismatch raises
`ArgumentError`, naming the kernel, the parameter, and what was expected and
got. Symbolic dims go to the kernel as int64 scalars after the pointers.

The kernel's code lives in its own JIT engine, freed when the Module is
garbage collected.
"""

from __future__ import annotations

import ctypes
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

import numpy as np

from kiln.errors import KilnError
from kiln.ir.dtype import DataType
from kiln.ir.types import SymDim, dim_subst, dim_value
from kiln.runtime.linker import Engine, kernel_symbol
from kiln.target import Target
from kiln.tir.dims import expr_dim
from kiln.tir.expr import Buffer, IntImm, PrimExpr, Var
from kiln.tir.flatten import flatten
from kiln.tir.functor import post_order_visit, used_vars
from kiln.tir.stmt import Allocate, PrimFunc

_INT32_MAX = 2**31 - 1

# The kernel ABI that the LLVM back end compiles to: a kernel returns STATUS_OK, or STATUS_OUT_OF_MEMORY
# when one of its heap temporaries (those over STACK_LIMIT bytes, or of symbolic size) could not be had.
STATUS_OK, STATUS_OUT_OF_MEMORY = 0, 1
STACK_LIMIT = 64 * 1024


def on_heap(buf: Buffer) -> bool:
    """Whether a (flattened, 1-D) temporary lives on the heap rather than the kernel's stack."""
    (size,) = buf.shape
    return not (isinstance(size, IntImm) and size.value * DataType.of(buf.dtype).bytes <= STACK_LIMIT)


def heap_temporaries(func: PrimFunc) -> list[Buffer]:
    """The temporaries of (flattened) `func` that the kernel takes from the heap."""
    found: list[Buffer] = []
    post_order_visit(flatten(func).body, lambda n: found.append(n.buffer)
                     if isinstance(n, Allocate) and on_heap(n.buffer) else None)
    return found


class ArgumentError(KilnError, TypeError, ValueError):
    """Arrays passed to a compiled kernel that do not fit its parameters."""


class KernelMemoryError(KilnError, MemoryError):
    """A kernel that could not allocate its temporary buffers (it freed what it had and stopped)."""


def numpy_dtype(dtype: str) -> np.dtype[Any]:
    """The numpy dtype of a loop-IR dtype string (bfloat16: ml_dtypes')."""
    return DataType.of(dtype).numpy()


class Param:
    """What one kernel parameter accepts: dtype, ndim, and per dim a static size or a symbolic Var.

    Shared by the CPU `Module` and the `CudaModule`, which check their arrays the same way.
    """

    def __init__(self, func: PrimFunc, index: int) -> None:
        buf = func.params[index]
        self.kernel = func.name
        self.name = buf.name
        self.dtype = numpy_dtype(buf.dtype)
        self.dims: list[int | Var | PrimExpr] = []
        for d in buf.shape:
            if isinstance(d, IntImm):
                self.dims.append(int(d.value))
            elif isinstance(d, Var) or expr_dim(d) is not None:
                self.dims.append(d)
            else:
                raise ArgumentError(f"kernel {func.name!r}: parameter {buf.name} has dim {d}; dims must be "
                                    "constants, size variables, or sums and products of them")
        self.shape_text = "(" + ", ".join(str(dim_text(d)) if not isinstance(d, int) else str(d)
                                          for d in self.dims) + ")"

    def error(self, message: str) -> ArgumentError:
        """An `ArgumentError` naming the kernel and this parameter."""
        return ArgumentError(f"kernel {self.kernel!r}, parameter {self.name!r}: {message}")

    def check_shape(self, a: Any, bound: dict[int, tuple[int, str]],
                    products: list[tuple[Param, int, PrimExpr, int]] | None = None) -> None:
        """Checks `a`'s dtype, ndim and dims; binds its symbolic dims in `bound` (id(Var) -> (size, where)).
        A dim that is a product of sizes (`2*n`, `n*s`) goes to `products`, checked once the sizes are known."""
        if a.dtype != self.dtype:
            raise self.error(f"expected dtype {self.dtype}, got {a.dtype}")
        if a.ndim != len(self.dims):
            raise self.error(f"expected {len(self.dims)} dims {self.shape_text}, got {a.ndim} dims {a.shape}")
        for axis, (want, got) in enumerate(zip(self.dims, a.shape, strict=True)):
            if isinstance(want, int):
                if got != want:
                    raise self.error(f"expected shape {self.shape_text}, got {a.shape} (dim {axis})")
                continue
            if not isinstance(want, Var):
                if products is None:
                    raise self.error(f"dim {axis} is the product {dim_text(want)}: check the arrays with the module")
                products.append((self, axis, want, got))
                continue
            prev = bound.get(id(want))
            if prev is None:
                if got > _INT32_MAX and want.dtype == "int32":
                    raise self.error(f"dim {axis} ({want.name}) = {got} exceeds the kernel's int32 sizes")
                bound[id(want)] = (got, f"{self.name}.shape[{axis}]")
            elif prev[0] != got:
                raise self.error(f"size {want.name} is {prev[0]} from {prev[1]} but {got} here "
                                 f"(shape {a.shape}, expected {self.shape_text})")
        if a.size > _INT32_MAX:  # loop variables are int32: a loop over all elements would wrap around
            raise self.error(f"shape {a.shape} has {a.size} elements, more than the {_INT32_MAX} that kernels index")


def dim_text(d: PrimExpr | int) -> int | str:
    """How a signature writes a kernel parameter's dim: an int, a size's name, or a sum or product of sizes as
    a relay type writes it (`2*n*s`, `p + s`: `kiln.ir.types`)."""
    if isinstance(d, int):
        return d
    dim = expr_dim(d)
    if dim is None:
        raise ArgumentError(f"dim {d} is neither a constant, a size variable nor a sum or product of them")
    return dim if isinstance(dim, int) else str(dim)


def bind_products(products: list[tuple[Param, int, PrimExpr, int]], bound: dict[int, tuple[int, str]]) -> None:
    """Checks the dims that are sums or products of sizes against the sizes bound (solving `c * v` for a size
    v that no plain dim gives); raises the ArgumentError of the first that does not fit."""
    for p, axis, want, got in sorted(products, key=lambda x: len(used_vars(x[2]))):
        where = f"{p.name}.shape[{axis}]"
        vs = sorted(used_vars(want), key=lambda v: v.name)
        free = [v for v in vs if id(v) not in bound]
        dim = expr_dim(want)  # a Param keeps only the dims expr_dim reads
        assert dim is not None
        env = {v.name: bound[id(v)][0] for v in vs if id(v) in bound}
        if isinstance(dim, SymDim) and len(free) == 1 and dict(dim.factors).get(free[0].name) == 1:  # c * v * ...
            rest = dim_value(dim_subst(dim, {free[0].name: 1}), env)
            if rest and got % rest == 0:
                bound[id(free[0])] = (got // rest, where)
                env[free[0].name] = got // rest
        elif free:
            raise p.error(f"dim {axis} is {dim_text(want)} = {got}, which does not give the sizes "
                          f"{', '.join(v.name for v in free)}: pass them (sizes=)")
        value = dim_value(dim, env) if len(env) == len(vs) else None
        if value != got:
            raise p.error(f"dim {axis} ({dim_text(want)}) should be {value} with "
                          + ", ".join(f"{v.name} = {bound[id(v)][0]} (from {bound[id(v)][1]})" for v in vs
                                      if id(v) in bound) + f", but the array has {got}")


def check_count(func: PrimFunc, params: list[Param], arrays: tuple[Any, ...]) -> None:
    """Refuses a call with another number of arrays than `func` has buffer parameters."""
    if len(arrays) != len(params):
        names = ", ".join(p.name for p in params)
        raise ArgumentError(f"kernel {func.name!r}: expected {len(params)} arrays ({names}), got {len(arrays)}")


class Module:
    """A compiled kernel: call it with numpy arrays; inspect its code with `get_source`."""

    def __init__(
        self,
        func: PrimFunc,
        target: Target,
        obj: bytes,
        symbols: list[str],
        sources: dict[str, str] | None = None,
        regenerate: Callable[[], dict[str, str]] | None = None,
    ) -> None:
        """Loads `obj` (object code of `func` for `target`) into a new JIT engine.

        Args:
            func: the kernel's loop IR (its params define the calling convention).
            target: the llvm target the code was compiled for.
            obj: relocatable object code.
            symbols: external symbols the code calls; each must resolve, or this raises.
            sources: texts already at hand ("ll", "asm").
            regenerate: computes the missing texts on demand (after a disk-cache hit).
        """
        self.func = func
        self.name = func.name
        self.target = target
        self._params = [Param(func, i) for i in range(len(func.params))]
        self._size_vars = func.size_vars
        self._sources = dict(sources or {})
        self._regenerate = regenerate
        self._lock = threading.Lock()
        self._engine = Engine(obj, target, symbols, func.name)
        weakref.finalize(self, self._engine.close)
        proto = ctypes.CFUNCTYPE(ctypes.c_int32, *([ctypes.c_void_p] * len(self._params)),
                                 *([ctypes.c_int64] * len(self._size_vars)))
        self._cfunc = proto(self._engine.address(kernel_symbol(func.name)))
        self.object_code = obj  # what `relay` libraries export, and `runtime.load` loads back
        self.symbols = list(symbols)
        self.object_size = len(obj)

    def __repr__(self) -> str:
        params = ", ".join(f"{p.name}: {p.dtype}{p.shape_text}" for p in self._params)
        return f"<kiln.runtime.Module {self.name}({params}) for {self.target.kind.name}>"

    def __call__(self, *arrays: Any, sizes: Mapping[str, int] | None = None) -> None:
        """Runs the kernel on `arrays` (one per buffer parameter, in order), in place. `sizes` gives size
        variables by name: those that appear only in products (`n*s`) cannot be read off the arrays.

        Raises:
            ArgumentError: when any array does not fit its parameter.
            KernelMemoryError: when the kernel could not allocate its temporary buffers.
        """
        values = self._check(arrays, sizes)
        if self._cfunc(*[a.ctypes.data for a in arrays], *values) != STATUS_OK:
            self.out_of_memory(values)

    def check(self, *arrays: Any, sizes: Mapping[str, int] | None = None) -> list[int]:
        """Checks `arrays` as a call would; returns the values of the kernel's size variables."""
        return self._check(arrays, sizes)

    def entry(self) -> Callable[..., int]:
        """The native entry: `entry(*pointers, *sizes)` returns 0, or 1 when out of memory.

        For callers that own every array and have checked them (the graph executor
        checks its inputs once and plans the rest); anyone else calls the module.
        """
        return self._cfunc

    def out_of_memory(self, sizes: Sequence[int]) -> NoReturn:
        """Raises the KernelMemoryError of a call with these sizes that returned 1."""
        temps = ", ".join(f"{b.name}{list(map(str, b.shape))} {b.dtype}" for b in heap_temporaries(self.func))
        raise KernelMemoryError(
            f"kernel {self.name!r}: out of memory allocating its temporary buffers ({temps}) "
            f"for sizes {dict(zip((v.name for v in self._size_vars), sizes, strict=True))}"
        )

    def _check(self, arrays: tuple[Any, ...], sizes: Mapping[str, int] | None = None) -> list[int]:
        params = self._params
        check_count(self.func, params, arrays)
        bound: dict[int, tuple[int, str]] = {}
        for v in self._size_vars:
            if sizes is not None and v.name in sizes:
                bound[id(v)] = (sizes[v.name], "the sizes given")
        products: list[tuple[Param, int, PrimExpr, int]] = []
        for p, a in zip(params, arrays, strict=True):
            if not isinstance(a, np.ndarray):
                raise p.error(f"expected a numpy.ndarray of {p.dtype}{p.shape_text}, got {type(a).__name__}")
            p.check_shape(a, bound, products)
            if not a.flags.c_contiguous:
                raise p.error(f"expected a C-contiguous array, got strides {a.strides} (use np.ascontiguousarray)")
            if not a.flags.aligned:
                raise p.error("expected an aligned array")
            if not a.flags.writeable:
                raise p.error("expected a writeable array (kernels may write any parameter)")
        for i in range(len(arrays)):
            for j in range(i):
                if arrays[i].size and arrays[j].size and np.may_share_memory(arrays[i], arrays[j]):
                    raise params[i].error(f"shares memory with parameter {params[j].name!r}; "
                                          "kernels need distinct arrays")
        bind_products(products, bound)
        return [bound[id(v)][0] for v in self._size_vars]

    def get_source(self, fmt: str = "ll") -> str:
        """The kernel's code: "ll" (optimized LLVM IR), "asm" (target assembly) or "tir" (loop IR).

        Raises:
            ValueError: for another format.
            KilnError: for the code of a kernel loaded from a library file (`runtime.load`, or
                relay.build's library cache), which holds object code only.
        """
        if fmt == "tir":
            return str(self.func)
        if fmt not in ("ll", "asm"):
            raise ValueError(f"get_source: format is 'll', 'asm' or 'tir', got {fmt!r}")
        with self._lock:
            if fmt not in self._sources and self._regenerate is not None:
                self._sources.update(self._regenerate())
            if fmt not in self._sources:
                raise KilnError(f"kernel {self.name!r} was loaded from a library file, which holds its object "
                                f"code only: no {fmt!r} text (build it again with KILN_CACHE=0 to see it)")
            return self._sources[fmt]
