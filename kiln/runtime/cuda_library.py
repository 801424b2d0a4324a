"""The CUDA kernels of an exported library: how `Library.export` writes a `CudaModule` and `runtime.load`
reads one back.

A cuda library is the same signed file as a CPU one (`kiln.runtime.library`):
the same graph, constants and checks, and per kernel, in place of object code,
everything `CudaModule` needs to launch it:

- `cubin`: a blob, the CUBIN NVRTC made (loading compiles nothing, so it needs
  neither NVRTC nor a GPU); `arch`, the `sm_XY` it is for;
- `source`: a blob, the CUDA C, only for `get_source("cuda")`;
- `params`: the PrimFunc's parameters, as a CPU kernel's; `size_vars`: its
  symbolic sizes (name, int32 or int64), in the order kernels take them;
- `workspaces`: device temporaries (name, dtype, size in elements);
  `written`: the parameters some kernel stores to; `float16`;
- `specs`: per kernel its name, grid, block, dynamic shared bytes and
  arguments (`KernelSpec`). Grid extents and workspace sizes are expressions
  of the size vars, stored as JSON lists (`["mul", "int64", ["var", 0],
  ["int", "int64", 4]]`): integer constants, size vars by index, casts, and
  the operators `eval_int` evaluates, nested at most `MAX_DEPTH` deep. Nothing
  is evaluated as code (no eval, no pickle).

Before anything runs, `load` checks each field (types, ranges, indices; size
vars against the parameters' shapes; each argument against what it points
at), then the CUBIN itself (`kiln.runtime.cubin`): an ELF for EM_CUDA whose
SM version is the kernel's `arch` and the target's, which defines every
kernel of `specs` with exactly as many parameters as `args`, each of the 8
bytes kiln passes (a pointer or a long long). Then, on a machine with a GPU,
that the CUBIN runs on the current device (`check_device`): a library for
another architecture is refused naming the library, the kernel and both.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from kiln.runtime.cubin import CubinError, read_cubin
from kiln.runtime.cuda_module import (
    BLOCK_LIMITS,
    CudaCode,
    CudaModule,
    KernelArg,
    KernelSpec,
    arch_runs_on,
    current_device,
)
from kiln.runtime.library import ExecutorError, HeaderChecker, LibraryFormatError, check_params, signature
from kiln.target import Target
from kiln.tir import expr as tx
from kiln.tir.stmt import PrimFunc

MAX_DEPTH = 32  # launch expressions are a few operators deep; this bounds a decoder's recursion
_KEYS = {"name", "params", "arch", "cubin", "source", "size_vars", "workspaces", "written", "float16", "specs"}
_SPEC_KEYS = {"name", "grid", "block", "shared_bytes", "args"}
_ARCH = re.compile(r"sm_([1-9][0-9]{1,2})[af]?")
_C_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SIZE_DTYPES = ("int32", "int64")
_INT_DTYPES = frozenset(["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"])
_ARG_KINDS = ("param", "workspace", "size")
_ARG_BYTES = 8  # kiln's kernels take pointers and long longs
_MAX_SHARED = 1 << 20  # above any GPU's shared memory per block; the driver refuses what the device lacks
_BINARY: dict[str, type[tx.BinaryOp]] = {
    "add": tx.Add, "sub": tx.Sub, "mul": tx.Mul, "div": tx.Div, "floordiv": tx.FloorDiv,
    "floormod": tx.FloorMod, "min": tx.Min, "max": tx.Max,
}
_TAGS = {cls: tag for tag, cls in _BINARY.items()}


# -- writing -------------------------------------------------------------------------------------------


def encode_expr(e: tx.PrimExpr, index: dict[int, int], what: str) -> list[Any]:
    """`e` as a JSON list, its size vars by position (`index`: id(Var) -> position).

    Raises:
        ExecutorError: for an expression other than integer arithmetic of those vars (`what` names it).
    """
    if isinstance(e, tx.IntImm):
        return ["int", e.dtype, int(e.value)]
    if isinstance(e, tx.Var) and id(e) in index:
        return ["var", index[id(e)]]
    if isinstance(e, tx.Cast) and e.dtype in _INT_DTYPES:
        return ["cast", e.dtype, encode_expr(e.value, index, what)]
    if type(e) in _TAGS and isinstance(e, tx.BinaryOp):
        return [_TAGS[type(e)], e.dtype, encode_expr(e.a, index, what), encode_expr(e.b, index, what)]
    raise ExecutorError(f"cannot export {what}: {e} is not integer arithmetic of the kernel's sizes")


def kernel_entry(m: CudaModule, params: list[dict[str, Any]], blob: Callable[[bytes], int]) -> dict[str, Any]:
    """The header entry of CUDA module `m` (`params` as `library.param_entries` wrote them); its CUBIN and
    source go to `blob`, which returns their indices.

    Raises:
        ExecutorError: for launch expressions `encode_expr` refuses, or size vars that share a name.
    """
    code = m.code
    names = [v.name for v in code.size_vars]
    if len(set(names)) != len(names):
        raise ExecutorError(f"cannot export kernel {m.name!r}: two of its sizes share a name ({names})")
    index = {id(v): i for i, v in enumerate(code.size_vars)}
    specs = [{
        "name": k.name,
        "grid": [[encode_expr(e, index, f"the grid of kernel {k.name!r}") for e in axis] for axis in k.grid],
        "block": list(k.block), "shared_bytes": k.shared_bytes,
        "args": [[a.kind, a.index] for a in k.args],
    } for k in code.kernels]
    return {
        "name": m.name, "params": params, "arch": m.arch, "cubin": blob(m.cubin), "source": blob(code.source.encode()),
        "size_vars": [[v.name, v.dtype] for v in code.size_vars],
        "workspaces": [[b.name, b.dtype, encode_expr(b.shape[0], index, f"workspace {b.name!r} of {m.name!r}")]
                       for b in code.workspaces],
        "written": sorted(code.written), "float16": code.uses_float16, "specs": specs,
    }


# -- reading ---------------------------------------------------------------------------------------------


def decode_expr(c: HeaderChecker, x: Any, size_vars: list[tx.Var], field: str, depth: int = 0) -> tx.PrimExpr:
    """The expression `encode_expr` wrote, every node checked (tag, arity, dtype, var index, int64 range).

    Raises:
        LibraryFormatError: naming `field`.
    """
    if depth > MAX_DEPTH:
        raise c.fail(field, f"an expression nested more than {MAX_DEPTH} deep")
    c.list_(x, field)
    tag = x[0] if x and isinstance(x[0], str) else None
    arity = {"int": 3, "var": 2, "cast": 3, **dict.fromkeys(_BINARY, 4)}.get(tag or "")
    if tag is None or arity is None or len(x) != arity:
        raise c.fail(field, f"{str(x)!r:.60} is not an expression (an integer, size var, cast or operator)")
    if tag == "var":
        return size_vars[c.index(x[1], len(size_vars), f"{field}[1]", "size var")]
    dtype = c.of(x[1], str, f"{field}[1]")
    if dtype not in _INT_DTYPES:
        raise c.fail(f"{field}[1]", f"{dtype!r:.40} is not an integer dtype")
    if tag == "int":
        value = c.of(x[2], int, f"{field}[2]")
        if not -(2**63) <= value < 2**63:
            raise c.fail(f"{field}[2]", f"{value} is outside int64")
        return tx.IntImm(dtype, value)
    if tag == "cast":
        return tx.Cast(dtype, decode_expr(c, x[2], size_vars, f"{field}[2]", depth + 1))
    a = decode_expr(c, x[2], size_vars, f"{field}[2]", depth + 1)
    b = decode_expr(c, x[3], size_vars, f"{field}[3]", depth + 1)
    return _BINARY[tag](dtype, a, b)


def load_kernel(c: HeaderChecker, k: Any, i: int, blobs: list[bytes],
                target: Target) -> tuple[CudaModule, list[dict[str, Any]]]:
    """The `CudaModule` of header kernel `i` and its parameters, every field and the CUBIN checked.

    Raises:
        LibraryFormatError: naming the field, or saying what in the CUBIN disagrees with the header.
    """
    f = f"kernels[{i}]"
    c.dict_(k, _KEYS, f)
    name = c.name(k["name"], f"{f}.name")
    params = check_params(c, k["params"], f"{f}.params")
    arch = _arch(c, k["arch"], f"{f}.arch", target)
    blob = c.index(k["cubin"], len(blobs), f"{f}.cubin", "blob")
    cubin = _check_cubin(c, blobs[blob], name, arch)
    try:
        source = blobs[c.index(k["source"], len(blobs), f"{f}.source", "blob")].decode()
    except UnicodeDecodeError as e:
        raise c.fail(f"{f}.source", f"not UTF-8 text ({e})") from e
    func, size_vars = _signature(c, name, params, k["size_vars"], f"{f}.size_vars")
    workspaces = []
    for j, w in enumerate(c.list_(k["workspaces"], f"{f}.workspaces")):
        wf = f"{f}.workspaces[{j}]"
        if len(c.list_(w, wf)) != 3:
            raise c.fail(wf, "expected [name, dtype, size]")
        size = decode_expr(c, w[2], size_vars, f"{wf}[2]")
        workspaces.append(tx.Buffer(c.of(w[0], str, f"{wf}[0]"), (size,), c.dtype(w[1], f"{wf}[1]")))
    written = [c.index(n, len(params), f"{f}.written[{j}]", "parameter")
               for j, n in enumerate(c.list_(k["written"], f"{f}.written"))]
    if len(set(written)) != len(written):
        raise c.fail(f"{f}.written", "a parameter is listed twice")
    counts = {"param": len(params), "workspace": len(workspaces), "size": len(size_vars)}
    specs = [_spec(c, s, f"{f}.specs[{j}]", size_vars, counts) for j, s in enumerate(c.list_(k["specs"], f"{f}.specs"))]
    if not specs or len({s.name for s in specs}) != len(specs):
        raise c.fail(f"{f}.specs", "expected one or more kernels of distinct names")
    for s in specs:
        found = cubin.get(s.name)
        if found is None:
            raise LibraryFormatError(f"{c.where}: the CUBIN of kernel {name!r} defines no kernel {s.name!r}")
        if found != (_ARG_BYTES,) * len(s.args):
            raise LibraryFormatError(
                f"{c.where}: kernel {s.name!r}: the header passes it {len(s.args)} arguments of {_ARG_BYTES} bytes, "
                f"but its code in the CUBIN takes {len(found)} of {list(found)} bytes")
    code = CudaCode(name, source, tuple(specs), tuple(workspaces), tuple(size_vars), frozenset(written),
                    c.of(k["float16"], bool, f"{f}.float16"))
    return CudaModule(func, target, code, blobs[blob], arch), params


def check_device(c: HeaderChecker, modules: list[CudaModule]) -> None:
    """Refuses kernels that cannot run on cupy's current GPU; without a GPU (or cupy), checks nothing.

    Raises:
        LibraryFormatError: naming the library, the kernel, its arch and the device's.
    """
    device = current_device()
    if device is None:
        return
    dev, cc = device
    for m in modules:
        if not arch_runs_on(m.arch, cc):
            raise LibraryFormatError(
                f"{c.where}: kernel {m.name!r} was compiled for {m.arch}, but the current GPU (device {dev}) is "
                f"sm_{cc}, which cannot run it; compile the model again for Target('cuda -arch=sm_{cc}')")


def _arch(c: HeaderChecker, value: Any, field: str, target: Target) -> str:
    arch = str(c.of(value, str, field))
    if not _ARCH.fullmatch(arch):
        raise c.fail(field, f"{arch!r:.40} is not an architecture such as 'sm_90'")
    wanted = target.get("arch")
    if wanted is not None and str(wanted) != arch:
        raise c.fail(field, f"{arch}, but the library's target is {target}")
    return arch


def _check_cubin(c: HeaderChecker, data: bytes, name: str, arch: str) -> dict[str, tuple[int, ...]]:
    """The parameter sizes of each kernel in `data`, after checking that it is a CUBIN for `arch`."""
    try:
        parsed = read_cubin(data, f"{c.where}: the CUBIN of kernel {name!r}")
    except CubinError as e:
        raise LibraryFormatError(str(e)) from e
    match = _ARCH.fullmatch(arch)
    assert match is not None
    if parsed.sm != int(match.group(1)):
        raise LibraryFormatError(f"{c.where}: the CUBIN of kernel {name!r} is for sm_{parsed.sm}, but the header "
                                 f"says {arch}")
    return parsed.kernels


def _signature(c: HeaderChecker, name: str, params: list[dict[str, Any]], value: Any,
               field: str) -> tuple[PrimFunc, list[tx.Var]]:
    """The kernel's PrimFunc signature and its size vars, which must be the parameters' symbolic dims
    in first-seen order."""
    dtypes: dict[str, str] = {}
    for j, v in enumerate(c.list_(value, field)):
        if len(c.list_(v, f"{field}[{j}]")) != 2 or v[1] not in _SIZE_DTYPES:
            raise c.fail(f"{field}[{j}]", "expected [name, 'int32' or 'int64']")
        dtypes[c.name(v[0], f"{field}[{j}][0]")] = v[1]
    seen = list(dict.fromkeys(d for p in params for d in p["shape"] if isinstance(d, str)))
    if seen != list(dtypes) or len(dtypes) != len(value):
        raise c.fail(field, f"sizes {list(dtypes)}, but the parameters' symbolic dims are {seen}")
    func = signature(name, params, dtypes)
    return func, func.size_vars


def _spec(c: HeaderChecker, s: Any, f: str, size_vars: list[tx.Var], counts: dict[str, int]) -> KernelSpec:
    """One kernel's launch: a C name, grid expressions, a block within CUDA's limits, shared bytes, args."""
    c.dict_(s, _SPEC_KEYS, f)
    name = c.of(s["name"], str, f"{f}.name")
    if not _C_NAME.fullmatch(name):
        raise c.fail(f"{f}.name", f"{name!r:.60} is not a C identifier")
    axes = c.list_(s["grid"], f"{f}.grid")
    if len(axes) != 3:
        raise c.fail(f"{f}.grid", f"expected 3 axes, got {len(axes)}")
    grid = tuple(tuple(decode_expr(c, e, size_vars, f"{f}.grid[{a}][{n}]")
                       for n, e in enumerate(c.list_(axis, f"{f}.grid[{a}]"))) for a, axis in enumerate(axes))
    block = [c.size(n, f"{f}.block[{a}]") for a, n in enumerate(c.list_(s["block"], f"{f}.block"))]
    if len(block) != 3 or any(not 1 <= n <= limit for n, limit in zip(block, BLOCK_LIMITS, strict=False)) or \
            block[0] * block[1] * block[2] > BLOCK_LIMITS[0]:
        raise c.fail(f"{f}.block", f"{block} is not a CUDA block (3 dims within {list(BLOCK_LIMITS)}, at most "
                                   f"{BLOCK_LIMITS[0]} threads)")
    shared = c.size(s["shared_bytes"], f"{f}.shared_bytes")
    if shared > _MAX_SHARED:
        raise c.fail(f"{f}.shared_bytes", f"{shared} bytes of shared memory")
    args = []
    for j, a in enumerate(c.list_(s["args"], f"{f}.args")):
        af = f"{f}.args[{j}]"
        if len(c.list_(a, af)) != 2 or a[0] not in _ARG_KINDS:
            raise c.fail(af, f"expected [kind, index] with a kind of {list(_ARG_KINDS)}")
        args.append(KernelArg(a[0], c.index(a[1], counts[a[0]], f"{af}[1]", a[0])))
    return KernelSpec(name, (grid[0], grid[1], grid[2]), (block[0], block[1], block[2]), shared, tuple(args))
