"""Helpers shared by the op tests: run an op's relation and reference with attrs built from keywords."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from kiln.ir.types import IncompleteType, TensorType, TupleType, Type
from kiln.registry import Op, OpPattern, attr
from kiln.relay.op._rel import RelationError
from kiln.runtime.module import numpy_dtype

RNG = np.random.default_rng(0)


def make_attrs(op: str, **kw: Any) -> Any:
    """The attrs of a call to `op` (None for an op without attributes)."""
    attrs_type: Any = Op.get(op).attrs_type
    return None if attrs_type is None else attrs_type.make(op, **kw)


def rel(op: str, types: list[Type], **kw: Any) -> Type | None:
    """Runs op's type relation on `types` with attrs made from `kw`."""
    return Op.get(op).get_attr(attr.FTypeRelation)(types, make_attrs(op, **kw))


def ref(op: str, *arrays: np.ndarray, **kw: Any) -> Any:
    """Runs op's numpy reference."""
    return Op.get(op).get_attr(attr.FReference)(make_attrs(op, **kw), *arrays)


def relation(op: str, arg_types: list[Type], attrs: Any = None) -> Type | None:
    """Runs op's type relation on `arg_types` with `attrs` as they are."""
    return Op.get(op).get_attr(attr.FTypeRelation)(arg_types, attrs)


def reference(op: str, attrs: Any, *inputs: Any) -> Any:
    """Runs op's numpy reference with `attrs` as they are."""
    return Op.get(op).get_attr(attr.FReference)(attrs, *inputs)


def check(op: str, attrs: Any, *inputs: Any) -> Any:
    """Runs the reference; its output has exactly the type the relation gives for the inputs' types."""
    out = reference(op, attrs, *inputs)
    assert type_of(out) == relation(op, [type_of(i) for i in inputs], attrs)
    return out


def assert_registered_complete(op: str, pattern: OpPattern, args: list[str], attrs_type: type | None,
                               level: int) -> None:
    """`op` verifies and carries this pattern, these arguments, attrs type and support level, a
    description and a numpy reference."""
    entry = Op.get(op)
    entry.verify()
    assert entry.get_attr(attr.TOpPattern) == pattern
    assert [a.name for a in entry.arguments] == args and entry.num_inputs == len(args)
    assert entry.attrs_type is attrs_type
    assert entry.support_level == level
    assert entry.description and entry.get_attr(attr.FReference) is not None


def assert_relation_waits(op: str) -> None:
    """`op`'s relation answers "not yet" while its inputs' types are incomplete."""
    assert relation(op, [IncompleteType() for _ in Op.get(op).arguments], None) is None


@contextlib.contextmanager
def rel_error(match: str, arg: int | None = 0) -> Iterator[None]:
    """Expects a RelationError whose message matches `match` and that blames argument `arg`."""
    with pytest.raises(RelationError, match=match) as info:
        yield
    assert info.value.arg == arg


def rand(*shape: int, dtype: str = "float32") -> np.ndarray:
    """Standard-normal values of `shape` and `dtype`."""
    return RNG.standard_normal(shape).astype(dtype)


def type_of(value: Any) -> Type:
    """The type of a reference's output: a tensor, or a tuple of them."""
    if isinstance(value, tuple):
        return TupleType(tuple(type_of(v) for v in value))
    return TensorType(value.shape, value.dtype)


def build_op(op: str, *arrays: np.ndarray, target: str = "llvm", **kw: Any) -> list[np.ndarray]:
    """Compiles one call of `op` on inputs shaped like `arrays` (through the op's selected
    implementation and schedule, as relay.build does) and runs it on them."""
    from kiln import relay
    from kiln.relay.backend.te_compiler import compile_primitive

    params = [relay.var(f"x{i}", shape=a.shape, dtype=str(a.dtype)) for i, a in enumerate(arrays)]
    func = relay.infer_type(relay.Function(params, relay.expr.call(op, params, make_attrs(op, **kw))))
    return compile_primitive(func, target, name=op.replace(".", "_"))(*arrays)


def check_build(op: str, *arrays: np.ndarray, rtol: float = 1e-5, atol: float = 1e-6, **kw: Any) -> None:
    """`build_op` agrees with the op's numpy reference (every output, dtype included)."""
    got = build_op(op, *arrays, **kw)
    want = ref(op, *arrays, **kw)
    wants = list(want) if isinstance(want, tuple) else [want]
    assert len(got) == len(wants), f"{op}: {len(got)} outputs, reference has {len(wants)}"
    for g, w in zip(got, wants, strict=True):
        w = np.asarray(w)
        assert g.dtype == w.dtype, f"{op}: dtype {g.dtype}, reference {w.dtype}"
        assert g.shape == w.shape, f"{op}: shape {g.shape}, reference {w.shape}"
        if g.dtype == numpy_dtype("bfloat16"):  # ml_dtypes' type, which numpy's testing does not compare
            np.testing.assert_allclose(g.astype(np.float32), w.astype(np.float32), rtol=rtol, atol=atol, err_msg=op)
        elif g.dtype.kind in "fc":
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=op)
        else:
            np.testing.assert_array_equal(g, w, err_msg=op)


# -- one call of an op compiled for any target, its inputs given as a tuple where the op takes one ------------


def op_function(op: str, *arrays: np.ndarray, **kw: Any) -> Any:
    """The type-checked Relay function of one call of `op` on parameters shaped like `arrays`.

    An op whose one argument is a tuple (concatenate, stack) gets all of them as that tuple.
    """
    from kiln import relay

    params = [relay.var(f"x{i}", shape=a.shape, dtype=str(a.dtype)) for i, a in enumerate(arrays)]
    args: list[Any] = [relay.Tuple(params)] if takes_tuple(op) else params
    return relay.infer_type(relay.Function(params, relay.expr.call(op, args, make_attrs(op, **kw))))


def takes_tuple(op: str) -> bool:
    """Whether `op`'s one argument is a tuple of tensors."""
    arguments = Op.get(op).arguments
    return len(arguments) == 1 and arguments[0].type_info == "Tuple"


def compile_op(op: str, *arrays: np.ndarray, target: str, **kw: Any) -> Any:
    """One call of `op` compiled for `target` as `build_op` compiles it: a te_compiler `CompiledKernel`."""
    from kiln.relay.backend.te_compiler import compile_primitive

    return compile_primitive(op_function(op, *arrays, **kw), target, name=op.replace(".", "_"))


def cuda_source_of(op: str, *arrays: np.ndarray, arch: str = "sm_90", **kw: Any) -> str:
    """The CUDA C that lowering generates for one call of `op` (compiled to a CUBIN for `arch` on the way)."""
    source: str = compile_op(op, *arrays, target=f"cuda -arch={arch}", **kw).module.get_source("cuda")
    return source


def run_on_device(kernel: Any, *arrays: np.ndarray, xp: Any) -> list[Any]:
    """Runs a compiled cuda kernel on device copies of `arrays` (`xp`: cupy, or a stand-in for it)
    into fresh device outputs, and returns those (device arrays: `.get()` for numpy)."""
    outs = [xp.empty(tuple(int(d) for d in ty.shape), dtype=numpy_dtype(str(ty.dtype))) for ty in kernel.out_types]
    kernel(*[xp.asarray(a) for a in arrays], outs=outs)
    return outs


def reference_outputs(op: str, *arrays: np.ndarray, **kw: Any) -> list[np.ndarray]:
    """The op's numpy reference on `arrays` (as one tuple where the op takes one), as a list of outputs."""
    want = ref(op, tuple(arrays), **kw) if takes_tuple(op) else ref(op, *arrays, **kw)
    return [np.asarray(w) for w in (want if isinstance(want, tuple) else [want])]


def assert_outputs_match(op: str, got: list[np.ndarray], want: list[np.ndarray], rtol: float = 1e-5,
                         atol: float = 1e-6) -> None:
    """Every output agrees with the reference: count, dtype, shape, then values (exactly for non-floats)."""
    assert len(got) == len(want), f"{op}: {len(got)} outputs, reference has {len(want)}"
    for g, w in zip(got, want, strict=True):
        assert isinstance(g, np.ndarray), f"{op}: got a {type(g).__name__}, expected a numpy array"
        assert g.dtype == w.dtype, f"{op}: dtype {g.dtype}, reference {w.dtype}"
        assert g.shape == w.shape, f"{op}: shape {g.shape}, reference {w.shape}"
        if g.dtype == numpy_dtype("bfloat16"):  # ml_dtypes' type, which numpy's testing does not compare
            np.testing.assert_allclose(g.astype(np.float32), w.astype(np.float32), rtol=rtol, atol=atol, err_msg=op)
        elif g.dtype.kind in "fc":
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=op)
        else:
            np.testing.assert_array_equal(g, w, err_msg=op)


def vnni_packed_words(b: np.ndarray) -> np.ndarray:
    """vnni_packed's words, written independently: word [c, q, l] holds b[4q + j, 16c + l] as its byte j."""
    k, n = b.shape
    k4, nb = -(-k // 4), -(-n // 16)
    out = np.zeros((nb, k4, 16), np.int64)
    for j in range(4):
        rows = np.zeros((k4, 16 * nb), np.int64)
        part = b[j::4].astype(np.uint8).astype(np.int64)
        rows[:part.shape[0], :n] = part
        out += rows.reshape(k4, nb, 16).transpose(1, 0, 2) << (8 * j)
    return out.astype(np.uint32).view(np.int32)
