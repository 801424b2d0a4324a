"""Target kinds: `llvm` and `cuda`, their options, and the registry that holds them.

A target kind is an entry of an `AttrRegistry`, like an op. Its metadata is
its option schema; its attributes are columns that a user can override at a
higher plevel, like any op attribute: `FTargetParser` (options from the host),
`TDeviceType` (where the code runs), and the hooks that other packages set on
it so that none of them compares kind names: `FBuild` (kiln.codegen: loop IR
to a runtime module) and `FDefaultSchedule` (the op library: the schedule of
an op by its pattern).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from kiln.errors import RegistryError, TargetError, did_you_mean
from kiln.registry.attr_registry import (
    AttrKey,
    AttrRegistry,
    RegEntry,
    RegKey,
    instance_of,
    is_callable,
)
from kiln.registry.site import Site
from kiln.target import detect, llvm_check

_TYPES = {"int": "an integer", "str": "a string", "bool": "true or false", "str-list": "a comma-separated list"}


@attrs.frozen
class Option:
    """One option of a target kind: `-name=value` in a target string."""

    name: str
    type: str  # one of _TYPES
    default: Any = None
    doc: str = ""
    check: Callable[[Any], bool] | None = attrs.field(default=None, eq=False)
    rule: str = ""  # what `check` accepts, in words
    brief: bool = False  # shown in `Target.summary()` (the CPU name, the GPU arch)

    def convert(self, value: object, kind: str) -> Any:
        """Returns `value` (a string from a target string, or a Python value) as this option's type."""
        where = f"option -{self.name} of target kind {kind}"
        expects = _TYPES[self.type] + (f" ({self.rule})" if self.rule else "")
        try:
            out = self._coerce(value)
        except (TypeError, ValueError):
            raise TargetError(f"{where} expects {expects}, got {value!r}") from None
        if self.check is not None and not self.check(out):
            raise TargetError(f"{where} expects {expects}, got {value!r}")
        return out

    def _coerce(self, value: object) -> Any:
        if self.type == "int":
            if isinstance(value, bool) or not isinstance(value, (int, str)):
                raise TypeError
            return int(value)
        if self.type == "bool":
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.lower() in ("true", "1", "false", "0"):
                return value.lower() in ("true", "1")
            raise ValueError
        if self.type == "str-list":
            if isinstance(value, str):
                items: list[object] = list(value.split(","))
            elif isinstance(value, (list, tuple)):
                items = list(value)
            else:
                raise TypeError
            if not all(isinstance(i, str) and i for i in items):
                raise ValueError
            return tuple(items)
        if not isinstance(value, str) or not value or any(c.isspace() for c in value):
            raise ValueError
        return value

    def format(self, value: Any) -> str:
        """Returns `value` as written after `-name=` in a target string."""
        if self.type == "str-list":
            return ",".join(value)
        if self.type == "bool":
            return "true" if value else "false"
        return str(value)


@attrs.frozen
class TargetKindMeta:
    """The option schema of a target kind, in declaration order."""

    options: tuple[Option, ...] = ()
    description: str = ""

    def option(self, name: str, kind: str) -> Option:
        """Returns the option `name` (underscores read as hyphens); unknown names list the valid ones."""
        canon = name.replace("_", "-")
        for opt in self.options:
            if opt.name == canon:
                return opt
        names = [o.name for o in self.options]
        raise TargetError(
            f"target kind {kind} has no option -{canon}{did_you_mean('-' + canon, ['-' + n for n in names])}; "
            f"its options: " + ", ".join("-" + n for n in names)
        )


class TargetKind(RegKey):
    """A kind of target (`llvm`, `cuda`), interned like an `Op`."""

    __slots__ = ()

    @staticmethod
    def get(name: str) -> TargetKind:
        """Returns the kind named `name`; an unknown name lists the valid ones."""
        return _REGISTRY.get(name)

    @staticmethod
    def list_names() -> list[str]:
        """Returns every registered kind name."""
        return _REGISTRY.list_names()

    @property
    def options(self) -> tuple[Option, ...]:
        """The kind's options, in declaration order."""
        return _REGISTRY.meta(self).options

    @property
    def description(self) -> str:
        """What the kind compiles for."""
        return _REGISTRY.meta(self).description

    def option(self, name: str) -> Option:
        """Returns option `name`; an unknown name lists the valid options."""
        return _REGISTRY.meta(self).option(name, self.name)

    def get_attr(self, key: AttrKey[Any] | str, default: Any = None) -> Any:
        """Returns this kind's attribute `key`, or `default`."""
        return _REGISTRY.get_attr(key, self, default)


class TargetKindRegEntry(RegEntry[TargetKind]):
    """The chainable registration of one target kind."""

    def describe(self, text: str) -> TargetKindRegEntry:
        """Sets what the kind compiles for."""
        _REGISTRY.update_meta(self.key, "describe", lambda m: attrs.evolve(m, description=text), Site.here())
        return self

    def add_option(
        self,
        name: str,
        type: str,
        default: Any = None,
        doc: str = "",
        check: Callable[[Any], bool] | None = None,
        rule: str = "",
        brief: bool = False,
    ) -> TargetKindRegEntry:
        """Declares option `-name` of type "int", "str", "bool" or "str-list" (`brief`: in summaries)."""
        if type not in _TYPES:
            raise RegistryError(f"target kind {self.name}: option type must be one of {sorted(_TYPES)}, got {type!r}")
        if not re.fullmatch(r"[a-z][a-z0-9]*(-[a-z0-9]+)*", name):
            raise RegistryError(f"target kind {self.name}: option names are lower-case-with-hyphens, got {name!r}")
        option = Option(name, type, None, doc, check, rule, brief)
        if default is not None:
            option = attrs.evolve(option, default=option.convert(default, self.name))

        def change(meta: TargetKindMeta) -> TargetKindMeta:
            if any(o.name == name for o in meta.options):
                raise RegistryError(f"target kind {self.name}: option -{name} is declared twice")
            return attrs.evolve(meta, options=(*meta.options, option))

        _REGISTRY.update_meta(self.key, "add_option", change, Site.here())
        return self

    def set_attr(self, key: AttrKey[Any] | str, value: object, plevel: int = 10) -> TargetKindRegEntry:
        """Sets attribute `key` of the kind; a higher plevel overrides a lower one."""
        super().set_attr(key, value, plevel)
        return self


_REGISTRY: AttrRegistry[TargetKindRegEntry, TargetKind, TargetKindMeta] = AttrRegistry(
    "target kind",
    TargetKind,
    TargetKindRegEntry,
    TargetKindMeta,
    name_pattern=r"[a-z][a-z0-9_]*",
    name_rule="target kind names are lower snake_case, e.g. 'llvm'",
    unknown_error=TargetError,
)

FTargetParser: AttrKey[Callable[[dict[str, Any]], Mapping[str, Any]]] = _REGISTRY.declare_key(
    AttrKey(
        "FTargetParser",
        "a callable",
        is_callable,
        "(options given) -> options with the missing ones filled in, e.g. from the host",
    )
)
TDeviceType: AttrKey[str] = _REGISTRY.declare_key(
    AttrKey("TDeviceType", "a string", instance_of(str), "the device that runs the code: 'cpu' or 'cuda'")
)
FBuild: AttrKey[Callable[[Any, Any], Any]] = _REGISTRY.declare_key(
    AttrKey(
        "FBuild",
        "a callable",
        is_callable,
        "(optimized tir.PrimFunc, Target) -> a callable runtime module (set by kiln.codegen for its back ends)",
    )
)
FDefaultSchedule: AttrKey[Callable[[Any], Callable[..., None]]] = _REGISTRY.declare_key(
    AttrKey(
        "FDefaultSchedule",
        "a callable",
        is_callable,
        "(op pattern) -> the schedule of an op that has no FSchedule for this kind (set by the op library)",
    )
)


def register_target_kind(name: str) -> TargetKindRegEntry:
    """Registers target kind `name` (or returns its entry) for a chain of `add_option` calls."""
    return _REGISTRY.register_or_get(name)


def kind_registry() -> AttrRegistry[TargetKindRegEntry, TargetKind, TargetKindMeta]:
    """Returns the global target-kind registry."""
    return _REGISTRY


# ---------------------------------------------------------------------------
# Built-in kinds
# ---------------------------------------------------------------------------


def _parse_llvm(opts: dict[str, Any]) -> dict[str, Any]:
    """Fills the host's CPU, features, triple and core count where they are not given.

    Features come from the host only when the CPU does too: `-mcpu=skylake` on
    another machine means skylake's own features.
    """
    host = detect.host_cpu()
    if opts.get("mcpu") is None:
        opts["mcpu"] = host.name
        if opts.get("mattr") is None:
            opts["mattr"] = host.features
    if opts.get("mtriple") is None:
        opts["mtriple"] = host.triple
    if opts.get("num-cores") is None:
        opts["num-cores"] = min(host.num_cores, _MAX_CORES)
    # LLVM aborts the process on a CPU or feature it does not know: check them out of process first.
    llvm_check.check_llvm_options(opts["mcpu"], tuple(opts.get("mattr") or ()), opts["mtriple"])
    return opts


def _parse_cuda(opts: dict[str, Any]) -> dict[str, Any]:
    """Fills the arch and limits of the machine's GPU where they are not given."""
    if opts.get("arch") is None:
        gpu = detect.cuda_device()
        if gpu is not None:
            for name, value in gpu.items():
                if opts.get(name) is None:
                    opts[name] = value
    return opts


def _positive(value: int) -> bool:
    return value > 0


_MAX_CORES = 1024  # kiln's thread pool has at most 1023 workers beside the calling thread


def _cores(value: int) -> bool:
    return 0 < value <= _MAX_CORES


(
    register_target_kind("llvm")
    .describe("CPU code through LLVM (llvmlite), for the host unless told otherwise")
    .add_option("mcpu", "str", doc="LLVM CPU name, e.g. znver4, skylake-avx512 (default: the host's)", brief=True)
    .add_option("mattr", "str-list", doc="LLVM features, e.g. +avx512f,-avx512vp2intersect (default: the host's)")
    .add_option("mtriple", "str", doc="LLVM target triple (default: the host's)")
    .add_option("num-cores", "int", doc="threads for parallel loops (default: the cores this process may use)",
                check=_cores, rule=f"1 to {_MAX_CORES}")
    .add_option("opt-level", "int", 3, "LLVM optimization level", check=lambda v: 0 <= v <= 3, rule="0 to 3")
    .set_attr(FTargetParser, _parse_llvm)
    .set_attr(TDeviceType, "cpu")
)

(
    register_target_kind("cuda")
    .describe("NVIDIA GPUs through CUDA C and NVRTC")
    .add_option("arch", "str", doc="compute capability, e.g. sm_90 (default: the machine's GPU)",
                check=lambda v: re.fullmatch(r"sm_[1-9][0-9]{1,2}[af]?", v) is not None, rule="sm_XY, e.g. sm_90",
                brief=True)
    .add_option("max-threads-per-block", "int", 1024, "threads per block at most", check=_positive, rule=">= 1")
    .add_option("max-shared-memory-per-block", "int", 49152,
                "bytes of shared memory one block may use (the opt-in maximum on GPUs that have one)",
                check=_positive, rule=">= 1")
    .add_option("thread-warp-size", "int", 32, "threads per warp", check=_positive, rule=">= 1")
    .add_option("registers-per-block", "int", 65536, "32-bit registers per block", check=_positive, rule=">= 1")
    .add_option("multiprocessor-count", "int", doc="streaming multiprocessors on the GPU", check=_positive,
                rule=">= 1")
    .set_attr(FTargetParser, _parse_cuda)
    .set_attr(TDeviceType, "cuda")
)
