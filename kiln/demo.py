"""The guided tour that `make demo` runs.

Until the compiler exists, it shows the two things kiln stands on: the target
it detects for this machine, and the op registry at work (a user-defined op, an
attribute map, a plevel override, the errors, a watcher, a rolled-back batch).
Everything it registers happens inside `registry.scope()` and is undone.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from kiln import registry
from kiln.errors import KilnError
from kiln.registry import Op, OpPattern, attr
from kiln.target import Target, TargetTag


@attrs.frozen
class ScaleAttrs:
    """Attributes of the demo op."""

    factor: float = attrs.field(default=1.0, metadata={"doc": "the multiplier"})


def _section(title: str) -> None:
    print(f"\n== {title}")


def _show_error(what: str, fn: Callable[[], object]) -> None:
    try:
        fn()
    except KilnError as err:
        print(f"{what}\n  -> {type(err).__name__}: {err}")
    else:
        raise AssertionError(f"{what} was accepted")


def show_targets() -> None:
    """Prints the detected host target and the GPU tags."""
    _section("the host, as Target('llvm') detects it")
    host = Target("llvm")
    features = host["mattr"]
    on = {f[1:] for f in features if f.startswith("+")}
    simd = [f for f in ("sse4.2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512bf16") if f in on]
    print(f"cpu {host['mcpu']}, triple {host['mtriple']}, {host['num-cores']} cores")
    print(f"{len(on)} of {len(features)} LLVM features enabled; SIMD: {' '.join(simd)}")
    print(f"str(target) is {len(str(host))} characters and parses back equal: {Target(str(host)) == host}")

    _section("GPU targets by tag")
    for name in TargetTag.list_names():
        t = Target(name)
        print(
            f"{name:16} arch {t['arch']}, {t['multiprocessor-count']} SMs, "
            f"{t['max-shared-memory-per-block'] // 1024} KiB shared/block  ({TargetTag.get(name).description})"
        )
    spec = "cuda -arch=sm_80 -max_threads_per_block=512"
    print(f"Target({spec!r}) -> {Target(spec)}")


def show_registry() -> None:
    """Registers a throwaway op and walks through the registry's rules."""
    with registry.scope():
        events: list[str] = []
        watcher = registry.add_watcher(lambda e: events.append(f"{e.action} {e.name} {e.attr or ''} -> {e.outcome}"))
        try:
            _section("registering an op with one set_attr chain")
            (
                registry.register_op("demo.scale")
                .describe("x * factor")
                .set_num_inputs(1)
                .add_argument("data", "Tensor", "the input")
                .set_attrs_type(ScaleAttrs)
                .add_type_rel("Identity", lambda arg_types, attrs: arg_types[0])
                .set_attr(attr.TOpPattern, OpPattern.ELEMWISE)
                .set_attr(attr.FReference, lambda attrs, x: x * attrs.factor)
            )
            op = Op.get("demo.scale")
            print(f"Op.get('demo.scale') is Op.get('demo.scale'): {op is Op.get('demo.scale')}")
            pattern = Op.get_attr_map(attr.TOpPattern)
            print(f"TOpPattern map: {pattern!r}, op in map: {op in pattern}, map[op] = {pattern[op].name}")
            print(f"op.has_attr(FCompute): {op.has_attr(attr.FCompute)}")

            _section("a user overrides a built-in attribute at a higher plevel")
            registry.register_op("demo.scale").set_attr(attr.TOpPattern, OpPattern.OPAQUE, plevel=20)
            print(f"map[op] = {pattern[op].name}; a lower plevel is ignored:")
            registry.register_op("demo.scale").set_attr(attr.TOpPattern, OpPattern.INJECTIVE, plevel=5)
            print(f"map[op] = {pattern[op].name}")

            _section("what the registry refuses")
            entry = registry.register_op("demo.scale")
            _show_error(
                "same key, same plevel twice:", lambda: entry.set_attr(attr.TOpPattern, OpPattern.BROADCAST, 20)
            )
            _show_error("a value of the wrong kind:", lambda: entry.set_attr(attr.TOpPattern, 3, plevel=30))
            _show_error("a typo in a key name:", lambda: entry.set_attr("TOpPatern", OpPattern.ELEMWISE))
            _show_error("a typo in an op name:", lambda: Op.get("demo.scael"))
            _show_error("a bad op name:", lambda: registry.register_op("Demo.Scale"))

            _section("a deferred batch is all or none")

            def batch() -> None:
                with registry.deferred():
                    registry.register_op("demo.half").set_num_inputs(2).add_argument("a", "Tensor")

            _show_error("an op declaring 2 inputs with 1 argument:", batch)
            print(f"after the rollback, 'demo.half' registered: {'demo.half' in Op.list_names()}")

            _section("the watcher saw every registration")
            for line in events:
                print(f"  {line}")

            _section("kiln ops demo.scale")
            print(registry.format_op(op))
        finally:
            registry.remove_watcher(watcher)
    print(f"\nafter registry.scope(), 'demo.scale' registered: {'demo.scale' in Op.list_names()}")


def show_relay() -> None:
    """Builds a small CNN with a symbolic batch, types it, prints it, parses it back, shows a type error."""
    import numpy as np

    from kiln import relay
    from kiln.relay.printer import astext

    rng = np.random.default_rng(0)
    _section("a Relay model with a symbolic batch size, typed through the op relations")
    x = relay.var("x", shape=("n", 3, 32, 32))
    w = relay.const(rng.standard_normal((16, 3, 3, 3)).astype(np.float32))
    h = relay.nn.relu(relay.nn.bias_add(relay.nn.conv2d(x, w, strides=(2, 2), padding=(1, 1)), relay.const(
        np.zeros(16, np.float32))))
    h = relay.nn.batch_flatten(relay.nn.global_avg_pool2d(h))
    out = relay.nn.softmax(relay.nn.dense(h, relay.const(rng.standard_normal((10, 16)).astype(np.float32))))
    mod = relay.transform.InferType()(relay.IRModule.from_expr(relay.Function([x], out)))
    text = astext(mod, show_meta_data=False)
    print(text.rstrip())
    back = relay.parse(str(mod))
    print(f"parse(str(mod)) is structurally equal to mod: {relay.structural_equal(back, mod)}")

    _section("a type error names the op, the argument, expected against found, and shows the IR")
    bad = relay.nn.dense(relay.var("data", shape=("n", 8)), relay.var("weight", shape=(4, 9)))
    try:
        relay.infer_type(relay.Function(relay.analysis.free_vars(bad), bad))
    except relay.TypeInferenceError as err:
        print(err)


def main() -> None:
    """Runs the tour."""
    print("kiln demo: the registry, the targets and the Relay IR (code generation comes with later issues)")
    show_targets()
    show_registry()
    show_relay()
