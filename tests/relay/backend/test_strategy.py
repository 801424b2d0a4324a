"""What lowering reads from the registry (kiln/relay/backend/strategy.py): set_attr that the compiler obeys.

An override from user code at a higher plevel — of an op's compute, of its
schedule, or a new implementation — changes the code that the next
relay.build generates: in the same process after the original was compiled
and cached, and in a fresh process whose disk cache is warm. Resetting the
override brings the original back.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kiln import registry, relay, te
from kiln.errors import DuplicateAttrError
from kiln.registry import NoImplementationError, Op, OpPattern, attr, register_implementation, register_op
from kiln.relay.backend.strategy import implementations_for, select_implementation
from kiln.target import TargetKind

RNG = np.random.default_rng(14)
DATA = RNG.standard_normal((4, 16)).astype("float32")


def plus(k: float) -> Any:
    """A compute of relu(x) + k: what an override computes instead of relu."""

    def compute(attrs: Any, inputs: list[te.Tensor], out_type: Any) -> list[te.Tensor]:
        (x,) = inputs
        return [te.compute(x.shape, lambda *i: te.max(x[i], te.const(0, x.dtype)) + te.const(k, x.dtype),
                           name=f"relu_plus_{int(k)}")]

    return compute


def split_by_7(sch: te.Schedule, anchor_outs: Any, outs: Any, target: Any) -> None:
    """A schedule whose loop IR shows: every output's axes fused and split by 7."""
    for t in outs:
        stage = sch[t]
        stage.split(stage.fuse(*stage.op.axis), factor=7)


def relu_lib() -> Any:
    x = relay.var("x", shape=DATA.shape)
    return relay.build(relay.Function([x], relay.nn.relu(x)))


def run(lib: Any) -> np.ndarray:
    return np.asarray(lib.create_executor()(x=DATA))


def loop_ir(lib: Any) -> str:
    return "\n".join(k.get_source("tir") for k in lib.kernels)


RELU = np.maximum(DATA, 0)


def test_a_compute_override_at_a_higher_plevel_is_built_and_its_reset_restores_relu() -> None:
    np.testing.assert_array_equal(run(relu_lib()), RELU)  # compiled and cached first
    relu = Op.get("nn.relu")
    relu.set_attr(attr.FCompute, plus(1), plevel=20)
    np.testing.assert_array_equal(run(relu_lib()), RELU + 1)
    relu.reset_attr(attr.FCompute, plevel=20)
    np.testing.assert_array_equal(run(relu_lib()), RELU)
    assert relu.get_attr(attr.FCompute) is not None  # the library's compute, shown again


def test_a_schedule_override_is_built_and_its_reset_restores_the_default() -> None:
    assert "* 7" not in loop_ir(relu_lib())
    relu = Op.get("nn.relu")
    relu.set_attr(attr.FSchedule["llvm"], split_by_7, plevel=20)
    lib = relu_lib()
    assert "i0_i1_fused_outer * 7" in loop_ir(lib)
    np.testing.assert_array_equal(run(lib), RELU)
    relu.reset_attr(attr.FSchedule["llvm"], plevel=20)
    assert "* 7" not in loop_ir(relu_lib())


def test_a_new_implementation_of_higher_priority_is_built_and_removing_it_restores_relu() -> None:
    np.testing.assert_array_equal(run(relu_lib()), RELU)
    register_implementation("nn.relu", plus(2), None, name="mine", priority=20)
    np.testing.assert_array_equal(run(relu_lib()), RELU + 2)
    Op.get("nn.relu").reset_attr(attr.FStrategy["*:mine"])
    np.testing.assert_array_equal(run(relu_lib()), RELU)


_FRESH = textwrap.dedent("""
    import sys
    import numpy as np
    from kiln import relay, te
    from kiln.registry import Op, attr, register_implementation
    sys.path.insert(0, {tests!r})
    from test_strategy import DATA, loop_ir, plus, relu_lib, run, split_by_7

    def show():
        lib = relu_lib()
        return str(round(float((run(lib) - np.maximum(DATA, 0)).max()), 3)) + " " + str("* 7" in loop_ir(lib))

    relu = Op.get("nn.relu")
    if sys.argv[1] == "compute":
        relu.set_attr(attr.FCompute, plus(1), plevel=20)
        print(show(), "/", relu.reset_attr(attr.FCompute, plevel=20) and show())
    elif sys.argv[1] == "schedule":
        relu.set_attr(attr.FSchedule["llvm"], split_by_7, plevel=20)
        print(show(), "/", relu.reset_attr(attr.FSchedule["llvm"], plevel=20) and show())
    elif sys.argv[1] == "implementation":
        register_implementation("nn.relu", plus(2), None, name="mine", priority=20)
        print(show(), "/", relu.reset_attr(attr.FStrategy["*:mine"]) and show())
    else:
        print(show())
""")


def test_overrides_are_built_in_a_fresh_process_whose_disk_cache_is_warm(tmp_path: Path) -> None:
    script = _FRESH.format(tests=str(Path(__file__).parent))
    env = {**os.environ, "KILN_CACHE": "1", "KILN_CACHE_DIR": str(tmp_path / "cache")}

    def fresh(override: str) -> str:
        done = subprocess.run([sys.executable, "-c", script, override], capture_output=True, text=True, env=env,
                              timeout=300, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout.split("\n")[-2]

    assert fresh("none") == "0.0 False"  # relu's kernel is on disk now
    assert list((tmp_path / "cache").rglob("*.kobj"))
    # each: the override's result, then relu again once the override is reset (in that fresh process)
    assert fresh("compute") == "1.0 False / 0.0 False"
    assert fresh("schedule") == "0.0 True / 0.0 False"
    assert fresh("implementation") == "2.0 False / 0.0 False"
    assert fresh("none") == "0.0 False"


def test_overrides_beat_the_tiled_implementation_of_dense() -> None:
    x, w = relay.var("x", shape=(8, 32)), relay.var("w", shape=(16, 32))
    func = relay.Function([x, w], relay.nn.dense(x, w))
    data, weight = RNG.standard_normal((8, 32)).astype("float32"), RNG.standard_normal((16, 32)).astype("float32")
    dense = Op.get("nn.dense")
    assert select_implementation(dense, "llvm", ["float32", "float32"]).name == "tiled"
    dense.set_attr(attr.FSchedule["llvm"], split_by_7, plevel=20)  # the generic compute, scheduled by the user
    chosen = select_implementation(dense, "llvm", ["float32", "float32"])
    assert (chosen.name, chosen.schedule, chosen.plevel) == ("generic", split_by_7, 20)
    lib = relay.build(func)
    assert "* 7" in loop_ir(lib)
    np.testing.assert_allclose(lib.create_executor()(x=data, w=weight), data @ weight.T, rtol=1e-5, atol=1e-5)


# --- the selection rules --------------------------------------------------------------------------


def _op(name: str = "test.strat") -> Op:
    (register_op(name).describe("identity").set_num_inputs(1).add_argument("x", "Tensor")
     .add_type_rel("Identity", lambda types, attrs: types[0]).set_attr(attr.TOpPattern, OpPattern.ELEMWISE))
    return Op.get(name)


def _compute(attrs: Any, inputs: list[te.Tensor], out_type: Any) -> list[te.Tensor]:
    return [te.compute(inputs[0].shape, lambda *i: inputs[0][i], name="copy")]


def _other(attrs: Any, inputs: list[te.Tensor], out_type: Any) -> list[te.Tensor]:
    return _compute(attrs, inputs, out_type)


def test_plevel_beats_priority_and_priority_orders_one_plevel() -> None:
    op = _op()
    op.set_attr(attr.FCompute, _compute)
    register_implementation(op.name, _other, None, name="fast", target="llvm", priority=5)
    assert select_implementation(op, "llvm", ["float32"]).name == "fast"
    assert select_implementation(op, "cuda", ["float32"]).name == "generic"  # "fast" serves llvm only
    register_implementation(op.name, _other, None, name="faster", priority=6)
    assert select_implementation(op, "llvm", ["float32"]).name == "faster"
    op.set_attr(attr.FCompute, _other, plevel=11)  # the generic one is plevel 11 now
    chosen = select_implementation(op, "llvm", ["float32"])
    assert (chosen.name, chosen.compute, chosen.plevel) == ("generic", _other, 11)


def test_dtypes_and_labels_restrict_the_choice() -> None:
    op = _op()
    op.set_attr(attr.FCompute, _compute)
    register_implementation(op.name, _other, None, name="ints", dtypes=["int32"], label="i", priority=5)
    assert select_implementation(op, "llvm", ["int32"]).name == "ints"
    assert select_implementation(op, "llvm", ["float32"]).name == "generic"
    assert select_implementation(op, "llvm", ["int32"], label="i").name == "ints"
    with pytest.raises(NoImplementationError, match=r"op 'test.strat' has no implementation for target 'llvm', "
                                                    r"input dtypes \['float32'\], label 'i'; registered: generic "
                                                    r"\(target llvm, any dtype, plevel 10, priority 0, at "
                                                    r".*test_strategy.py:\d+\); ints \(target \*, int32, label 'i'"):
        select_implementation(op, "llvm", ["float32"], label="i")


def test_an_op_without_any_compute_is_named_with_what_is_missing() -> None:
    op = _op()
    with pytest.raises(NoImplementationError, match=r"op 'test.strat' has no implementation for target 'llvm', "
                                                    r"input dtypes \['float32'\]; registered: none \(the op has no "
                                                    r"FCompute\)"):
        select_implementation(op, "llvm", ["float32"])


def test_the_generic_schedule_is_the_ops_then_the_kinds_default() -> None:
    op = _op()
    op.set_attr(attr.FCompute, _compute)
    llvm, cuda = TargetKind.get("llvm"), TargetKind.get("cuda")
    default = select_implementation(op, llvm, ["float32"]).schedule
    assert default is not None and default is not split_by_7
    op.set_attr(attr.FSchedule, split_by_7)  # for every kind ...
    assert select_implementation(op, cuda, ["float32"]).schedule is split_by_7
    op.set_attr(attr.FSchedule["llvm"], _schedule_llvm)  # ... but llvm's own wins there
    assert select_implementation(op, llvm, ["float32"]).schedule is _schedule_llvm
    assert select_implementation(op, cuda, ["float32"]).schedule is split_by_7
    assert [i.name for i in implementations_for(op, llvm)] == ["generic"]


def _schedule_llvm(sch: Any, anchor_outs: Any, outs: Any, target: Any) -> None:
    """A stand-in CPU schedule (never run here)."""


def test_an_implementation_registered_twice_at_one_plevel_names_both_sites() -> None:
    op = _op()
    register_implementation(op.name, _compute, None, name="twice", target="llvm")
    with pytest.raises(DuplicateAttrError, match=r"attribute FStrategy\[llvm:twice\] of op test.strat is set twice "
                                                 r"at plevel 10: first at .*test_strategy.py:\d+, again at "
                                                 r".*test_strategy.py:\d+"):
        register_implementation(op.name, _other, None, name="twice", target="llvm")
    register_implementation(op.name, _other, None, name="twice", target="llvm", plevel=20)
    assert select_implementation(op, "llvm", ["float32"]).compute is _other


def test_implementations_live_in_the_registry_and_a_scope_takes_them_back() -> None:
    op = _op()
    with registry.scope():
        register_implementation(op.name, _compute, None, name="scoped")
        assert op.has_attr("FStrategy[*:scoped]")
        assert [i.name for i in registry.implementations(op.name)] == ["scoped"]
    assert registry.implementations(op.name) == ()
    assert not op.has_attr(attr.FStrategy["*:scoped"])
