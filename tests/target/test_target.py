"""Targets: parsing, round trips, tags, host detection, errors, and the kind/tag registries."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import llvmlite.binding as llvm
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kiln import registry
from kiln.errors import RegistryError, TargetError
from kiln.registry import AttrRegistry
from kiln.runtime import linker
from kiln.target import (
    FTargetParser,
    Target,
    TargetKind,
    TargetKindRegEntry,
    TargetTag,
    cuda_device,
    host_cpu,
    register_tag,
    register_target_kind,
)

TAGS = ["nvidia/h100", "nvidia/h200", "nvidia/a100", "nvidia/l4", "nvidia/rtx-4090", "nvidia/rtx-3090"]


def test_llvm_target_detects_the_host_cpu() -> None:
    target = Target("llvm")
    assert target.kind is TargetKind.get("llvm")
    assert target["mcpu"] == llvm.get_host_cpu_name()
    assert target["mtriple"] == llvm.get_process_triple()
    host_features = llvm.get_host_cpu_features()
    enabled = {f[1:] for f in target["mattr"] if f.startswith("+")}
    assert enabled == {name for name, on in host_features.items() if on}
    assert ("avx512f" in enabled) == bool(host_features.get("avx512f"))
    assert target["num-cores"] == host_cpu().num_cores >= 1
    assert target["opt-level"] == 3
    assert target.device_type == "cpu"


def test_an_explicit_cpu_does_not_take_the_host_features() -> None:
    target = Target("llvm -mcpu=skylake-avx512")
    assert target["mcpu"] == "skylake-avx512"
    assert target.get("mattr") is None
    assert target["mtriple"] == llvm.get_process_triple()


def test_options_are_typed() -> None:
    target = Target("llvm -mcpu=znver4 -num-cores=2 -mattr=+avx512f,-avx512vp2intersect -opt-level=2")
    assert target["num-cores"] == 2
    assert target["opt-level"] == 2
    assert target["mattr"] == ("+avx512f", "-avx512vp2intersect")
    assert target.get("num_cores") == 2  # underscores read as hyphens


@pytest.mark.parametrize(
    "spec",
    [
        "llvm",
        "llvm -mcpu=znver4 -num-cores=2",
        "llvm -mcpu=znver4 -mattr=+avx2,+fma -mtriple=x86_64-unknown-linux-gnu -num-cores=16 -opt-level=1",
        "cuda -arch=sm_90",
        "cuda -arch=sm_80 -max-threads-per-block=256 -thread-warp-size=32",
        *TAGS,
        "nvidia/h100 -max-threads-per-block=512",
        "nvidia/a100 -arch=sm_86",
    ],
)
def test_string_round_trip(spec: str) -> None:
    target = Target(spec)
    again = Target(str(target))
    assert again == target
    assert hash(again) == hash(target)
    assert str(again) == str(target)
    assert Target(target.export()) == target  # and through the JSON-ready dict


@given(
    mcpu=st.sampled_from(["znver4", "skylake-avx512", "haswell", "generic"]),
    cores=st.integers(1, 256),
    level=st.integers(0, 3),
    features=st.lists(st.sampled_from(["+avx2", "-avx2", "+fma", "+avx512f", "-sse4.2"]), max_size=4, unique=True),
)
def test_llvm_round_trip_for_any_options(mcpu: str, cores: int, level: int, features: list[str]) -> None:
    spec = f"llvm -mcpu={mcpu} -num-cores={cores} -opt-level={level}"
    if features:
        spec += " -mattr=" + ",".join(features)
    target = Target(spec)
    assert Target(str(target)) == target
    assert target["num-cores"] == cores


@given(
    arch=st.sampled_from(["sm_70", "sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_100"]),
    threads=st.integers(32, 1024),
    smem=st.integers(1, 1 << 18),
)
def test_cuda_round_trip_for_any_options(arch: str, threads: int, smem: int) -> None:
    target = Target({"kind": "cuda", "arch": arch, "max_threads_per_block": threads,
                     "max-shared-memory-per-block": smem})
    assert Target(str(target)) == target
    assert target["arch"] == arch and target["max-threads-per-block"] == threads


def test_dict_form_and_string_form_agree() -> None:
    assert Target({"kind": "cuda", "arch": "sm_80"}) == Target("cuda -arch=sm_80")
    assert Target({"tag": "nvidia/h100", "max-threads-per-block": 512}) == Target(
        "nvidia/h100 -max-threads-per-block=512"
    )
    assert Target(Target("cuda -arch=sm_80")) == Target("cuda -arch=sm_80")


@pytest.mark.parametrize(
    ("tag", "arch", "sms"),
    [("nvidia/h100", "sm_90", 132), ("nvidia/h200", "sm_90", 132), ("nvidia/a100", "sm_80", 108),
     ("nvidia/l4", "sm_89", 58), ("nvidia/rtx-4090", "sm_89", 128), ("nvidia/rtx-3090", "sm_86", 82)],
)
def test_tags_carry_the_real_arch_and_limits(tag: str, arch: str, sms: int) -> None:
    target = Target(tag)
    assert target.tag == tag
    assert target.kind is TargetKind.get("cuda")
    assert target["arch"] == arch
    assert target["multiprocessor-count"] == sms
    assert target["max-threads-per-block"] == 1024
    assert target["thread-warp-size"] == 32
    assert target["registers-per-block"] == 65536
    assert target["max-shared-memory-per-block"] > 48 * 1024  # the opt-in maximum
    assert str(target) == tag
    assert target.device_type == "cuda"


def test_tag_equals_the_kind_with_the_same_options() -> None:
    h100 = Target("nvidia/h100")
    spelled = Target("cuda " + " ".join(f"-{k}={v}" for k, v in TargetTag.get("nvidia/h100").options.items()))
    assert h100 == spelled
    assert Target("nvidia/h100") != Target("nvidia/a100")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("cdua", r"unknown target kind 'cdua' \(did you mean 'cuda'\?\); known target kinds: llvm, cuda"),
        ("", "empty target string; known kinds: llvm, cuda"),
        ("llvm -mcpux=znver4", r"no option -mcpux \(did you mean '-mcpu'\?\); its options: -mcpu, -mattr, -mtriple"),
        ("cuda -arch=sm_90 -max-thread-per-block=4", "did you mean '-max-threads-per-block'"),
        ("llvm -num-cores=two", r"option -num-cores of target kind llvm expects an integer \(1 to 1024\), got 'two'"),
        ("llvm -num-cores=0", r"expects an integer \(1 to 1024\), got '0'"),
        ("llvm -num-cores=100000", r"expects an integer \(1 to 1024\), got '100000'"),
        ("llvm -opt-level=4", r"expects an integer \(0 to 3\)"),
        ("cuda -arch=90", r"option -arch of target kind cuda expects a string \(sm_XY, e.g. sm_90\), got '90'"),
        ("llvm mcpu=znver4", "malformed target option 'mcpu=znver4'.*-name=value"),
        ("llvm -num-cores", "needs a value: -num-cores=..."),
        ("llvm -mcpu=", "has no value after '='"),
        ("llvm -mcpu=a -mcpu=b", "-mcpu is given twice"),
        ("llvm -mattr=+avx,,+fma", "expects a comma-separated list"),
        ("nvidia/h10", r"unknown target tag 'nvidia/h10' \(did you mean 'nvidia/h100'.*known target tags: nvidia/h100"),
    ],
)
def test_bad_target_strings_say_what_is_valid(spec: str, message: str) -> None:
    with pytest.raises(TargetError, match=message):
        Target(spec)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"arch": "sm_80"}, "either a 'kind' or a 'tag'"),
        ({"kind": "cuda", "tag": "nvidia/h100"}, "either a 'kind' or a 'tag'"),
        ({"kind": 3}, "kind or tag is a string"),
        ({"kind": "cuda", "arch": 90}, "expects a string"),
        ({"kind": "llvm", "num-cores": True}, "expects an integer"),
        ({"kind": "llvm", "num-cores": 2.5}, "expects an integer"),
        (42, "a target is a string, a dict or a Target"),
    ],
)
def test_bad_target_dicts_are_refused(spec: object, message: str) -> None:
    with pytest.raises(TargetError, match=message):
        Target(spec)  # type: ignore[arg-type]  # the point: bad specs


def test_missing_option_lookup_names_the_target() -> None:
    with pytest.raises(TargetError, match="does not set option -multiprocessor-count"):
        Target("cuda -arch=sm_80")["multiprocessor-count"]
    with pytest.raises(TargetError, match="no option -nope"):
        Target("cuda -arch=sm_80").get("nope")


def test_with_target_sets_the_current_target_per_thread() -> None:
    assert Target.current() is None
    with pytest.raises(TargetError, match="no target is set"):
        Target.current(allow_none=False)
    outer, inner = Target("cuda -arch=sm_80"), Target("nvidia/h100")
    seen_in_thread: list[Target | None] = []
    with outer:
        assert Target.current() is outer
        with inner:
            assert Target.current() is inner
            worker = threading.Thread(target=lambda: seen_in_thread.append(Target.current()))
            worker.start()
            worker.join()
        assert Target.current() is outer
    assert Target.current() is None
    assert seen_in_thread == [None]


def test_kinds_and_tags_live_in_attr_registries() -> None:
    kinds = AttrRegistry.global_(TargetKindRegEntry)
    assert kinds.kind == "target kind"
    assert kinds.list_names()[:2] == ["llvm", "cuda"]
    assert TargetKind.get("llvm") is TargetKind.get("llvm")
    assert AttrRegistry.by_kind("target tag").list_names() == TAGS
    llvm_kind = TargetKind.get("llvm")
    assert [o.name for o in llvm_kind.options] == ["mcpu", "mattr", "mtriple", "num-cores", "opt-level"]
    cuda_kind = TargetKind.get("cuda")
    assert {"arch", "max-threads-per-block", "max-shared-memory-per-block", "thread-warp-size",
            "registers-per-block"} <= {o.name for o in cuda_kind.options}


def test_a_user_registers_a_kind_and_a_tag() -> None:
    (
        register_target_kind("my_npu")
        .describe("a test accelerator")
        .add_option("cores", "int", 4, "cores", check=lambda v: v > 0, rule=">= 1")
        .add_option("fast", "bool", False)
    )
    register_tag("acme/npu-1", {"kind": "my_npu", "cores": 8}, "Acme NPU")
    assert Target("my_npu")["cores"] == 4
    assert Target("my_npu -fast")["fast"] is True
    assert Target("my_npu -fast=false")["fast"] is False
    assert Target("acme/npu-1")["cores"] == 8
    assert Target(str(Target("acme/npu-1 -cores=2"))) == Target("my_npu -cores=2")
    with pytest.raises(TargetError, match="expects an integer"):
        register_tag("acme/npu-2", {"kind": "my_npu", "cores": "many"})
    with pytest.raises(RegistryError, match="option -cores is declared twice"):
        register_target_kind("my_npu").add_option("cores", "int")
    with pytest.raises(RegistryError, match="invalid target tag name"):
        register_tag("NoSlash", {"kind": "my_npu"})


def test_a_user_overrides_the_host_parser_at_a_higher_plevel() -> None:
    def fixed(opts: dict[str, object]) -> dict[str, object]:
        return {"mcpu": "haswell", "mtriple": "x86_64-unknown-linux-gnu", "num-cores": 1, **{
            k: v for k, v in opts.items() if v is not None}}

    register_target_kind("llvm").set_attr(FTargetParser, fixed, plevel=20)
    assert Target("llvm")["mcpu"] == "haswell"
    assert Target("llvm").get("mattr") is None
    with pytest.raises(RegistryError, match="set twice at plevel 20"):
        register_target_kind("llvm").set_attr(FTargetParser, fixed, plevel=20)


def test_scope_undoes_target_registrations() -> None:
    with registry.scope():
        register_target_kind("throwaway")
    with pytest.raises(TargetError, match="unknown target kind 'throwaway'"):
        Target("throwaway")


def test_cuda_without_an_arch_takes_the_machines_gpu_or_stays_open() -> None:
    gpu = cuda_device()
    target = Target("cuda")
    if gpu is None:  # CI and the developers' machines: no GPU
        assert target.get("arch") is None
        assert str(target) == "cuda"
    else:
        assert target["arch"] == gpu["arch"]
        assert target["multiprocessor-count"] == gpu["multiprocessor-count"]
    assert Target(str(target)) == target


# ---------------------------------------------------------------------------
# Options LLVM does not know: refused by kiln, never handed to LLVM (which aborts the process)
# ---------------------------------------------------------------------------

_UNKNOWN_TO_LLVM = [
    ("llvm -mcpu=foo", r"option -mcpu of target kind llvm: 'foo' is not a CPU that LLVM [\d.]+ knows for x86_64"),
    ("llvm -mcpu=skylak", r"'skylak' is not a CPU that LLVM [\d.]+ knows .*\(did you mean 'skylake'"),
    ("llvm -mcpu=i686", r"-mcpu=i686 .*LLVM cannot generate code for it .*64-bit code requested"),
    ("llvm -mcpu=x86-64 -mattr=-64bit", r"-mattr=-64bit .*LLVM cannot generate code for it"),
    ("llvm -mcpu=x86-64 -mattr=-sse", r"-mattr=-sse .*LLVM cannot generate code for it .*SSE disabled"),
    ("llvm -mattr=+foo", r"option -mattr of target kind llvm: 'foo' \(in '\+foo'\) is not a feature that LLVM"),
    ("llvm -mattr=+avx512fp", r"'avx512fp' \(in '\+avx512fp'\) is not a feature .*did you mean 'avx512f'"),
    ("llvm -mattr=avx2", r"option -mattr of target kind llvm: feature 'avx2' has no sign: write \+avx2"),
    ("llvm -mtriple=aarch64-unknown-linux-gnu",
     r"option -mtriple of target kind llvm: 'aarch64-unknown-linux-gnu' is for 'aarch64', but kiln runs"),
    ("llvm -mtriple=x86_64-apple-darwin", r"'x86_64-apple-darwin' is for another operating system"),
]

# Each spec through Target(...) and relay.build(..., target=spec), in a child process: LLVM
# aborting would end the child (a failed test), not the test runner.
_CHILD = textwrap.dedent("""
    import json, sys
    import numpy as np
    from kiln import relay
    from kiln.errors import KilnError
    from kiln.target import Target
    x = relay.var("x", shape=(8,), dtype="float32")
    fn = relay.Function([x], relay.nn.relu(x))
    for spec in json.loads(sys.argv[1]):
        for how in ("Target", "relay.build"):
            try:
                Target(spec) if how == "Target" else relay.build(fn, target=spec)
                print(json.dumps([spec, how, "no error"]), flush=True)
            except KilnError as exc:
                print(json.dumps([spec, how, type(exc).__name__ + ": " + str(exc)]), flush=True)
""")


def test_options_llvm_does_not_know_are_kiln_errors_never_an_abort() -> None:
    specs = [spec for spec, _ in _UNKNOWN_TO_LLVM]
    done = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(specs)], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    got = {(spec, how): text for spec, how, text in map(json.loads, done.stdout.splitlines())}
    for spec, message in _UNKNOWN_TO_LLVM:
        for how in ("Target", "relay.build"):
            assert re.search("TargetError: .*" + message, got[spec, how]), (spec, how, got[spec, how])


@pytest.mark.parametrize(("spec", "message"), _UNKNOWN_TO_LLVM)
def test_options_llvm_does_not_know_say_what_is_wrong(spec: str, message: str) -> None:
    with pytest.raises(TargetError, match=message):
        Target(spec)


def test_kiln_compile_with_an_unknown_cpu_exits_with_kilns_error(tmp_path: Path) -> None:
    model = tmp_path / "m.txt"
    model.write_text('def @main(%x: Tensor[(4,), float32]) {\n  nn.relu(%x)\n}\n')
    done = subprocess.run([sys.executable, "-m", "kiln", "compile", str(model), "--target", "llvm -mcpu=foo",
                           "-o", str(tmp_path / "m.kiln")], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.startswith("kiln: error: option -mcpu of target kind llvm: 'foo' is not a CPU that LLVM")
    assert "Traceback" not in done.stderr and not (tmp_path / "m.kiln").exists()


@pytest.mark.parametrize("spec", ["llvm -mcpu=x86-64", "llvm -mcpu=x86-64-v3 -mattr=+avx2,-avx512f",
                                  "llvm -mcpu=generic", "llvm -mcpu=skylake-avx512",
                                  "llvm -mtriple=x86_64-pc-linux-gnu"])
def test_cpus_and_features_llvm_knows_are_accepted(spec: str) -> None:
    target = Target(spec)
    assert Target(str(target)) == target
    linker.create_target_machine(target)  # the same check again, answered from the cache


def test_a_parser_that_skips_the_check_still_cannot_hand_llvm_an_unknown_cpu() -> None:
    def lenient(opts: dict[str, object]) -> dict[str, object]:
        return {"mtriple": host_cpu().triple, "num-cores": 1, **{k: v for k, v in opts.items() if v is not None}}

    with registry.scope():
        register_target_kind("llvm").set_attr(FTargetParser, lenient, plevel=30)
        target = Target("llvm -mcpu=foo")
    with pytest.raises(TargetError, match="'foo' is not a CPU that LLVM"):
        linker.create_target_machine(target)


def test_a_kind_without_a_back_end_is_refused_by_every_build() -> None:
    import kiln
    from kiln import relay, te

    with registry.scope():
        register_target_kind("nobackend").describe("a kind no code generator serves")
        target = Target("nobackend")
        assert Target("llvm").backend() is not None
        message = r"target kind 'nobackend' has no back end \(no FBuild attribute\): cannot compile for nobackend"
        with pytest.raises(TargetError, match=message):
            target.backend()
        a = te.placeholder((4,), name="A")
        b = te.compute((4,), lambda i: a[i] * 2.0, name="B")
        with pytest.raises(TargetError, match=message):
            kiln.build(te.create_schedule(b), [a, b], target=target)
        x = relay.var("x", shape=(4,))
        with pytest.raises(TargetError, match=message):
            relay.build(relay.Function([x], relay.exp(x)), target=target)
