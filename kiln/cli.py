"""The `kiln` command line.

```
kiln ops [NAME] [--json] [--onnx] the op registry, or the ONNX converters
kiln targets [--json]            target kinds, their options, the tags
kiln target [SPEC] [--json]      one target, parsed (default: the host CPU)
kiln show MODEL [--fusion] [--params P.npz] [--shape NAME=1,3,224,224]
                                 the typed IR of a model (Relay text or .onnx);
                                 with --fusion also the IR after relay.build's passes
kiln compile MODEL [--params P.npz] [--shape ...] [--target llvm] -o OUT.kiln
                                 relay.build, then write the library file
kiln run OUT.kiln --input x=x.npy [--input ...] [--output OUT.npy|OUT.npz]
                                 load a library, run it, save or summarize the outputs
kiln bench MODEL [--shape ...] [--repeat N] [--per-kernel]
                                 time the compiled model on random inputs, beside
                                 onnxruntime for an .onnx model when it is installed;
                                 --per-kernel: then each kernel's time, slowest first
kiln demo                        the main job that `make demo` runs

MODEL is a file in the Relay text format, or an ONNX model (a name ending in
.onnx), imported with `relay.frontend.from_onnx`; --shape fixes an input's
symbolic dims.
```

Every error a user can cause (a missing or unreadable file, text that does not
parse or type-check, a corrupt library, inputs of the wrong name, shape or
dtype) prints `kiln: error: ...` on stderr and exits with status 2. The timing
of `kiln bench` lives in `kiln.bench`, the progress bar in `kiln.progress`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from kiln import __version__, log, registry
from kiln.errors import KilnError, did_you_mean
from kiln.ir.module import IRModule
from kiln.progress import ProgressBar
from kiln.relay.backend.build_module import optimize_explained
from kiln.runtime.library import is_library_file
from kiln.target import Target, TargetKind, TargetTag, TDeviceType


class CliError(KilnError, ValueError):
    """A command-line problem: a file that cannot be read or written, a malformed option."""


# ---------------------------------------------------------------------------
# Helpers shared with kiln.demo
# ---------------------------------------------------------------------------


def _os_message(err: OSError) -> str:
    """`No such file or directory: 'x.npy'` rather than `[Errno 2] No such file ...`."""
    if err.filename is None:
        return str(err)
    return f"{err.strerror or type(err).__name__}: {str(err.filename)!r}"


def _read_text(path: str | Path) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise CliError(f"cannot read the model: {_os_message(err)}") from None
    except UnicodeDecodeError as err:
        raise CliError(f"{str(path)!r} is not a text file ({err.reason} at byte {err.start})") from None


def load_model(path: str | Path) -> IRModule:
    """Reads a model in kiln's Relay text format and type-checks it.

    Args:
        path: a file holding `def @main(...) { ... }` (what `str(mod)` prints), or
            one function `fn (...) { ... }`, which becomes main.

    Returns:
        The typed module.

    Raises:
        CliError: the file cannot be read, or holds neither a module nor a function.
        ParseError, TypeInferenceError: the text is malformed or does not type-check.
    """
    from kiln import relay

    parsed = relay.parse(_read_text(path), source_name=str(path))
    if isinstance(parsed, relay.Function):
        parsed = IRModule.from_expr(parsed)
    if not isinstance(parsed, IRModule):
        raise CliError(f"{str(path)!r} holds a {type(parsed).__name__}; a model is 'def @main(...) {{ ... }}'")
    if "main" not in parsed:
        raise CliError(f"{str(path)!r} defines no @main; it defines {', '.join('@' + n for n in parsed)}")
    typed: IRModule = relay.transform.InferType()(parsed)
    return typed


def _is_onnx(path: str | Path) -> bool:
    return str(path).endswith(".onnx")


def parse_shapes(specs: Sequence[str]) -> dict[str, tuple[int | str, ...]]:
    """`--shape NAME=1,3,224,224` options as {name: shape}; a dim that is not a number stays symbolic."""
    shapes: dict[str, tuple[int | str, ...]] = {}
    for spec in specs:
        name, eq, dims = spec.partition("=")
        if not eq or not name:
            raise CliError(f"--shape {spec!r}: expected NAME=D0,D1,... (e.g. input=1,3,224,224)")
        parts = [d.strip() for d in dims.split(",") if d.strip()] if dims.strip() else []
        shapes[name] = tuple(int(d) if d.lstrip("-").isdigit() else d for d in parts)
        if any(isinstance(d, int) and d < 0 for d in shapes[name]):
            raise CliError(f"--shape {spec!r}: dims must not be negative")
    return shapes


def load_any(path: str | Path, shapes: Sequence[str] = ()) -> tuple[IRModule, dict[str, np.ndarray]]:
    """A model in the Relay text format (no params) or an ONNX model (its initializers frozen), typed."""
    if is_library_file(path):
        raise CliError(f"{str(path)!r} is a compiled kiln library, not a model (ONNX or Relay text): run it with "
                       f"`kiln run {path}`, or give the model it was compiled from")
    if _is_onnx(path):
        from kiln.relay.frontend import from_onnx

        if not Path(path).is_file():
            raise CliError(f"cannot read the model: no such file: {str(path)!r}")
        return from_onnx(path, shape=parse_shapes(shapes))
    if shapes:
        raise CliError("--shape applies to ONNX models; a Relay text model declares its shapes")
    return load_model(path), {}


def _load_npy(path: str | Path, what: str) -> Any:
    """np.load of an .npy or .npz file (never a pickle); its failures as CliError naming `what`."""
    try:
        with open(path, "rb") as f:
            magic = f.read(6)
    except OSError as err:
        raise CliError(f"cannot read {what}: {_os_message(err)}") from None
    if not (magic.startswith(b"\x93NUMPY") or magic.startswith(b"PK\x03\x04")):
        raise CliError(f"{what}: {str(path)!r} is not a numpy .npy or .npz file")
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        raise CliError(f"{what}: {str(path)!r} is not a readable numpy file ({err})") from None


def load_params(path: str | Path) -> dict[str, np.ndarray]:
    """The arrays of an .npz file by name (`np.savez(path, w0=..., b0=...)`)."""
    data = _load_npy(path, "params")
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise CliError(f"params {str(path)!r} must be an .npz archive of named arrays (np.savez), not one array")
    with data:
        return {name: data[name] for name in data.files}


# ---------------------------------------------------------------------------
# kiln ops / targets / target
# ---------------------------------------------------------------------------


def _cmd_ops(args: argparse.Namespace) -> None:
    if args.onnx:
        _print_onnx_converters(args)
    elif args.name:
        op = registry.Op.get(args.name)
        print(json.dumps(registry.op_record(op), indent=2) if args.json else registry.format_op(op))
    else:
        print(registry.export_json() if args.json else registry.format_table())


def _print_onnx_converters(args: argparse.Namespace) -> None:
    from kiln.relay.frontend.onnx import converters

    entries = [e for e in converters() if not args.name or e.op_type == args.name]
    if args.name and not entries:
        raise CliError(f"no ONNX converter for {args.name!r}; `kiln ops --onnx` lists them")
    rows = [{"domain": e.domain or "ai.onnx", "op_type": e.op_type, "since": e.since, "until": e.until,
             "where": e.where} for e in entries]
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    for r in rows:
        opsets = f"{r['since']}-{r['until']}" if r["until"] else f"{r['since']}+"
        print(f"{r['domain']:<10} {r['op_type']:<24} opsets {opsets:<7} {r['where']}")


def _targets_record() -> dict[str, object]:
    kinds = [
        {
            "name": kind.name,
            "description": kind.description,
            "options": [
                {"name": o.name, "type": o.type, "default": o.default, "doc": o.doc} for o in kind.options
            ],
        }
        for kind in map(TargetKind.get, TargetKind.list_names())
    ]
    tags = [
        {"name": tag.name, "description": tag.description, "kind": tag.kind.name, "options": tag.options}
        for tag in map(TargetTag.get, TargetTag.list_names())
    ]
    return {"kinds": kinds, "tags": tags}


def _cmd_targets(args: argparse.Namespace) -> None:
    record = _targets_record()
    if args.json:
        print(json.dumps(record, indent=2))
        return
    for kind in map(TargetKind.get, TargetKind.list_names()):
        print(f"{kind.name}: {kind.description}")
        for o in kind.options:
            default = "" if o.default is None else f" (default {o.format(o.default)})"
            print(f"  -{o.name}: {o.type}{default}  {o.doc}")
    print("tags:")
    for tag in map(TargetTag.get, TargetTag.list_names()):
        print(f"  {Target(tag.name)!s:40}  {tag.description}")
        print(f"    = {tag.kind.name} " + " ".join(f"-{k}={v}" for k, v in tag.options.items()))


def _cmd_target(args: argparse.Namespace) -> None:
    target = Target(args.spec)
    if args.json:
        print(json.dumps(target.export(), indent=2))
        return
    print(str(target))
    for name, value in target.attrs.items():
        text = target.kind.option(name).format(value)
        if name == "mattr":
            on = [f for f in value if f.startswith("+")]
            text = f"{len(on)} enabled, {len(value) - len(on)} disabled ({', '.join(on[:8])}, ...)"
        print(f"  {name:28} {text}")


# ---------------------------------------------------------------------------
# kiln show / compile / run
# ---------------------------------------------------------------------------


def _cmd_show(args: argparse.Namespace) -> None:
    from kiln.relay.printer import astext

    if args.params and not (args.fusion or args.svg):
        raise CliError("--params is used by --fusion and --svg only (the typed IR is printed before any binding)")
    mod, params = _model_and_params(args)
    onnx = _is_onnx(args.model)
    # An ONNX model's weights are constants: print them as meta[...] references, not their values.
    print(astext(mod, show_meta_data=False) if onnx else str(mod), end="")
    if args.fusion or onnx:
        fused, report = optimize_explained(mod, params)
        if args.fusion:
            print("\n// after relay.build's passes (large constants elided as meta[...])")
            print(astext(fused, show_meta_data=False), end="")
        print(f"\n{report}")
    if args.svg:
        from kiln import relay

        lib = relay.build(mod, target=args.target, params=params)
        try:
            lib.draw(args.svg)
        except OSError as err:
            raise CliError(f"cannot write the picture: {_os_message(err)}") from None
        print(f"\nwrote the fused graph ({len(lib.graph.launches)} launches) to {args.svg}")


def _model_and_params(args: argparse.Namespace) -> tuple[IRModule, dict[str, np.ndarray] | None]:
    mod, params = load_any(args.model, args.shape)
    if args.params:
        params = {**params, **load_params(args.params)}
    return mod, params or None


_EMIT = {"tir": "tir", "ll": "ll", "asm": "s", "cuda": "cu", "ptx": "ptx"}  # --emit kind -> file suffix


def _emit_kinds(spec: str | None, target: str) -> list[str]:
    kinds = [k.strip() for k in (spec or "").split(",") if k.strip()]
    kind_of = Target(target).kind
    allowed = ("tir", "cuda", "ptx") if kind_of.get_attr(TDeviceType) == "cuda" else ("tir", "ll", "asm")
    for kind in kinds:
        if kind not in allowed:
            raise CliError(f"--emit {kind!r}: a {kind_of.name} library's kernels have "
                           + ", ".join(allowed))
    return kinds


def _cmd_compile(args: argparse.Namespace) -> None:
    import contextlib
    import os

    from kiln import relay
    from kiln.ir.transform import PassContext, PrintIRInstrument

    mod, params = _model_and_params(args)
    kinds = _emit_kinds(args.emit, args.target)
    bar = ProgressBar()
    start = time.perf_counter()
    with contextlib.ExitStack() as stack:
        if kinds:  # a library from the cache holds object code only: build afresh for its text
            stack.callback(os.environ.__setitem__, "KILN_CACHE", os.environ.get("KILN_CACHE", "1"))
            os.environ["KILN_CACHE"] = "0"
        if args.dump_ir:  # relay.build's own opt level; a build under instruments skips the library cache
            stack.enter_context(PassContext(opt_level=3, instruments=[PrintIRInstrument(folder=args.dump_ir)]))
        try:
            lib = relay.build(mod, target=args.target, params=params, progress=bar)
        finally:
            bar.finish()
    seconds = time.perf_counter() - start
    try:
        lib.export(args.output)
        emitted = [Path(args.output).with_suffix("." + _EMIT[kind]) for kind in kinds]
        for kind, path in zip(kinds, emitted, strict=True):
            path.write_text(lib.get_source(kind))
    except OSError as err:
        raise CliError(f"cannot write the library: {_os_message(err)}") from None
    slots = [lib.graph.slots[s] for s in lib.graph.inputs]
    inputs = ", ".join(f"{s.name} {s.text}" for s in slots)
    kernels, outputs = len(lib.kernels), len(lib.graph.outputs)
    print(f"kiln: compiled {kernels} kernel{'s' * (kernels != 1)} in {seconds:.2f} s for {lib.target.kind.name}; "
          f"wrote {args.output} (inputs: {inputs or 'none'}; {outputs} output{'s' * (outputs != 1)})",
          file=sys.stderr)
    for kind, path in zip(kinds, emitted, strict=True):
        print(f"kiln: wrote {path} (the {kind} of the {kernels} kernels)", file=sys.stderr)
    if args.dump_ir:
        print(f"kiln: wrote the IR after each pass to {args.dump_ir}", file=sys.stderr)
    if lib.graph.symbols:
        print(f"kiln: the dynamic dims stay symbolic ({', '.join(lib.graph.symbols)}): the library runs any size "
              "that agrees across its inputs (--shape NAME=D0,D1,... fixes them instead)", file=sys.stderr)


def _read_inputs(specs: Sequence[str]) -> dict[str, np.ndarray]:
    """`NAME=FILE.npy` binds one input; `FILE.npz` binds each array in it by its name."""
    inputs: dict[str, np.ndarray] = {}
    for spec in specs:
        name, eq, path = spec.partition("=")
        if eq:
            if not name or not path:
                raise CliError(f"--input {spec!r}: expected NAME=FILE.npy")
            arrays = {name: _load_npy(path, f"input {name!r}")}
            if isinstance(arrays[name], np.lib.npyio.NpzFile):
                arrays[name].close()
                raise CliError(f"--input {spec!r}: {path!r} is an .npz archive; pass it as --input {path}")
        elif spec.endswith(".npz"):
            arrays = load_params(spec)
        else:
            raise CliError(f"--input {spec!r}: expected NAME=FILE.npy or FILE.npz")
        for key, value in arrays.items():
            if key in inputs:
                raise CliError(f"input {key!r} is given twice")
            inputs[key] = value
    return inputs


def _output_paths(path: str, count: int) -> list[Path]:
    """Where `.npy` outputs go: `path` itself for one output, `stem_0.npy`, `stem_1.npy`, ... for several."""
    p = Path(path)
    if count == 1:
        return [p]
    stem = p.name[: -len(".npy")] if p.name.endswith(".npy") else p.name
    return [p.with_name(f"{stem}_{i}.npy") for i in range(count)]


def _summary(arr: np.ndarray) -> str:
    head = f"{arr.dtype}{list(arr.shape)}"
    if arr.size == 0:
        return head + "  (empty)"
    values = arr.astype(np.float64) if arr.dtype != np.bool_ else arr.astype(np.int64)
    first = ", ".join(f"{v:.4g}" for v in values.reshape(-1)[:6]) + (", ..." if arr.size > 6 else "")
    return (f"{head}  min {float(np.min(values)):.4g}  max {float(np.max(values)):.4g}  "
            f"mean {float(np.mean(values)):.4g}  std {float(np.std(values)):.4g}\n  first values: {first}")


def _cmd_run(args: argparse.Namespace) -> None:
    from kiln import runtime

    if Path(args.library).is_file() and not is_library_file(args.library):
        what = "an ONNX model" if _is_onnx(args.library) else "not a kiln library"
        stem = Path(args.library).with_suffix(".kiln")
        raise CliError(f"{args.library!r} is {what}: `kiln run` runs what `kiln compile` writes. Compile it first "
                       f"(`kiln compile {args.library} -o {stem}`, then `kiln run {stem}`), or time the model with "
                       f"`kiln bench {args.library}`")
    try:
        lib = runtime.load(args.library, trust=args.trust)
    except OSError as err:
        raise CliError(f"cannot read the library: {_os_message(err)}") from None
    slots = {lib.graph.slots[s].name: lib.graph.slots[s] for s in lib.graph.inputs}
    for spec in args.input:  # a name the library lacks, before any file is read
        name, eq, _ = spec.partition("=")
        if eq and name and name not in slots:
            raise CliError(f"the library has no input {name!r}{did_you_mean(name, slots)}; its inputs: "
                           + ", ".join(f"{n} ({v.dtype}{list(v.shape)})" for n, v in slots.items()))
    inputs = _read_inputs(args.input)
    ex = lib.create_executor()
    missing = [n for n in ex.input_names if n not in inputs]
    if missing:
        wanted = ", ".join(f"{n} ({slots[n].dtype}{list(slots[n].shape)})" for n in missing)
        raise CliError(f"missing input(s) {wanted}; give each as --input NAME=FILE.npy")
    ex.run(**inputs)
    # a cuda library's outputs are on the GPU: .get() copies one to numpy
    outputs = [out if isinstance(out, np.ndarray) else out.get() for out in map(ex.get_output, range(ex.num_outputs))]
    names = lib.output_names  # an ONNX model's own, else output_0, output_1, ...
    try:
        if args.output is None:
            for name, out in zip(names, outputs, strict=True):
                print(f"{name}: {_summary(out)}")
        elif args.output.endswith(".npz"):
            # as np.savez writes an archive, but any name is an entry (np.savez would take `allow_pickle` as its flag)
            with zipfile.ZipFile(args.output, "w") as archive:
                for name, out in zip(names, outputs, strict=True):
                    with archive.open(f"{name}.npy", "w", force_zip64=True) as entry:
                        np.lib.format.write_array(entry, out, allow_pickle=False)
            print(f"wrote {args.output}: " + ", ".join(
                f"{name} {out.dtype}{list(out.shape)}" for name, out in zip(names, outputs, strict=True)))
        else:
            for path, out in zip(_output_paths(args.output, len(outputs)), outputs, strict=True):
                with open(path, "wb") as f:  # a file object: np.save would append .npy to other names
                    np.save(f, out, allow_pickle=False)
                print(f"wrote {path}: {out.dtype}{list(out.shape)}")
    except OSError as err:
        raise CliError(f"cannot write the outputs: {_os_message(err)}") from None


def _cmd_bench(args: argparse.Namespace) -> None:
    from kiln import bench

    mod, params = _model_and_params(args)
    if args.repeat < 1:
        raise CliError("--repeat must be at least 1")
    try:
        bench.compare(args.model, mod, params, target=args.target, repeat=args.repeat,
                      onnxruntime=_is_onnx(args.model) and not args.no_onnxruntime, per_kernel=args.per_kernel,
                      html=args.html)
    except OSError as err:
        raise CliError(f"cannot write the profile: {_os_message(err)}") from None


def _cmd_cache(args: argparse.Namespace) -> None:
    from kiln.codegen import cache
    from kiln.runtime import library_cache

    folder = library_cache.cache_directory()
    kinds = {"kernels": (cache.kernel_files, cache.MAX_FILES, cache.MAX_BYTES),
             "libraries": (lambda: library_cache.folder().glob("*.kiln"), library_cache.MAX_ENTRIES,
                           library_cache.MAX_BYTES)}
    if args.action == "clear":
        removed = 0
        for files, _, _ in kinds.values():
            for f in files():
                with contextlib.suppress(FileNotFoundError):
                    f.unlink()
                    removed += 1
        print(f"kiln cache: removed {removed} files from {folder}")
        return
    state = "on" if library_cache.enabled() else "off (KILN_CACHE=0)"
    print(f"kiln cache: {folder} ({state})")
    for name, (files, most, limit) in kinds.items():
        count, total = library_cache.usage(files())
        print(f"  {name:9} {count:6} files, {total / 2**20:9.1f} MiB  (kept: {most} files, "
              f"{limit / 2**30:.0f} GiB at most; the least recently used go first)")


def _cmd_demo(args: argparse.Namespace) -> None:
    from kiln import demo

    demo.main()


# ---------------------------------------------------------------------------
# The parser and main
# ---------------------------------------------------------------------------

_RUN_EPILOG = """\
inputs:
  --input NAME=FILE.npy binds one input; --input FILE.npz binds every array of
  the archive to the input of its name. Every input of the model must be given,
  with the shape and dtype it was compiled for.
outputs:
  without --output, each output's name, dtype, shape, statistics and first
  values are printed. An output is named as the ONNX model names it, else
  output_0, output_1, ... --output OUT.npz writes all outputs to one archive
  by those names (np.load(OUT.npz)["output_0"]). Any other name, OUT.npy, gets
  a model's one output as an .npy file; several outputs go to OUT_0.npy,
  OUT_1.npy, ...
"""


def _add(
    sub: Any, name: str, run: Callable[[argparse.Namespace], None], help: str, **kwargs: Any
) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = sub.add_parser(name, help=help, description=help, **kwargs)
    parser.set_defaults(run=run)
    return parser


def build_parser() -> argparse.ArgumentParser:
    """Returns the argument parser of the `kiln` command."""
    parser = argparse.ArgumentParser(prog="kiln", description="kiln, a deep-learning compiler")
    parser.add_argument("--version", action="version", version=f"kiln {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="log what kiln does to stderr: -v builds and caches, -vv more (also KILN_LOG_LEVEL)")
    sub = parser.add_subparsers(dest="command", required=True)

    ops = _add(sub, "ops", _cmd_ops, "list the registered ops, or show one in full")
    ops.add_argument("name", nargs="?", help="an op name, e.g. nn.conv2d")
    ops.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ops.add_argument("--onnx", action="store_true",
                     help="list the ONNX converters instead (domain, op type, opsets, where each is defined)")

    targets = _add(sub, "targets", _cmd_targets, "list the target kinds, their options, and the tags")
    targets.add_argument("--json", action="store_true", help="print JSON")

    target = _add(sub, "target", _cmd_target, "parse a target and show its options (default: the host)")
    target.add_argument("spec", nargs="?", default="llvm", help='e.g. "llvm -mcpu=znver4" or nvidia/h100')
    target.add_argument("--json", action="store_true", help="print JSON")

    model_help = "a model: an ONNX file (.onnx), or the Relay text format (what str(mod) prints)"
    params_help = "an .npz of arrays bound as constants to main's parameters of the same names"
    shape_help = "an input's shape, e.g. input=1,3,224,224 (repeat for several; fixes symbolic dims)"

    show = _add(sub, "show", _cmd_show, "print the typed IR of a model (Relay text or ONNX)")
    show.add_argument("model", help=model_help)
    show.add_argument("--fusion", action="store_true",
                      help="also print the IR after relay.build's passes and the fusion report")
    show.add_argument("--params", metavar="P.npz", help="weights to bind by name before the passes (with --fusion)")
    show.add_argument("--shape", action="append", default=[], metavar="NAME=DIMS", help=shape_help)
    show.add_argument("--svg", metavar="OUT.svg", help="compile the model and draw its fused graph: a box per "
                      "kernel with the ops it fuses, edges with dtypes and shapes")
    show.add_argument("--target", default="llvm", help="the target of --svg's build (default: llvm)")

    comp = _add(sub, "compile", _cmd_compile, "compile a model (Relay text or ONNX) to a library file")
    comp.add_argument("model", help=model_help)
    comp.add_argument("--params", metavar="P.npz", help=params_help)
    comp.add_argument("--shape", action="append", default=[], metavar="NAME=DIMS", help=shape_help)
    comp.add_argument("--target", default="llvm", help="the target (default: llvm, the host CPU)")
    comp.add_argument("-o", "--output", required=True, metavar="OUT.kiln", help="the library file to write")
    comp.add_argument("--dump-ir", metavar="DIR", help="write the IR after every pass to DIR, numbered in order "
                      "(001_InferType.txt, ...)")
    comp.add_argument("--emit", metavar="KINDS", help="also write the kernels' code beside OUT.kiln: a comma list "
                      "of tir, ll, asm (CPU) or tir, cuda, ptx (GPU), as OUT.tir, OUT.ll, OUT.s, OUT.cu, OUT.ptx")

    bench = _add(sub, "bench", _cmd_bench,
                 "time a compiled model on random inputs, beside onnxruntime for an ONNX model")
    bench.add_argument("model", help=model_help)
    bench.add_argument("--params", metavar="P.npz", help=params_help)
    bench.add_argument("--shape", action="append", default=[], metavar="NAME=DIMS", help=shape_help)
    bench.add_argument("--target", default="llvm", help="the target (default: llvm, the host CPU)")
    bench.add_argument("--repeat", type=int, default=50, help="timed runs of each (default 50); the median is shown")
    bench.add_argument("--no-onnxruntime", action="store_true", help="time kiln alone")
    bench.add_argument("--per-kernel", action="store_true",
                       help="then time each kernel launch on its own (median of --repeat runs) and print the "
                            "kernels by time: the ops each fuses, calls, ms, share, output shape")
    bench.add_argument("--html", metavar="OUT.html", help="write the per-kernel profile as an HTML bar chart")

    run = _add(sub, "run", _cmd_run, "run a compiled library on inputs from .npy/.npz files",
               epilog=_RUN_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("library", metavar="LIB.kiln", help="a file written by `kiln compile`")
    run.add_argument("--input", "-i", action="append", default=[], metavar="NAME=FILE.npy",
                     help="an input (repeat for several), or FILE.npz of inputs by name")
    run.add_argument("--output", "-o", metavar="OUT.npy|OUT.npz", help="where to save the outputs (see below)")
    run.add_argument("--trust", action="store_true",
                     help="run a library that your kiln did not write (its code runs with your rights; "
                          "its structure is still checked): see SECURITY.md")

    cache = _add(sub, "cache", _cmd_cache, "the compiled-kernel and library cache: where it is and what it holds, "
                 "or empty it")
    cache.add_argument("action", choices=["info", "clear"], nargs="?", default="info",
                       help="info (default): the folder, its files and bytes; clear: remove them")
    _add(sub, "demo", _cmd_demo, "the main job that `make demo` runs: build, check and time an MLP and a CNN")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the `kiln` command; returns its exit status."""
    args = build_parser().parse_args(argv)
    if args.verbose:
        log.set_level("INFO" if args.verbose == 1 else "DEBUG")
    try:
        args.run(args)
    except KilnError as err:
        print(f"kiln: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `kiln ops | head`
        return 0
    except OSError as err:  # a file error no command anticipated
        print(f"kiln: error: {_os_message(err)}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
