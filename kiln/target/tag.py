"""Target tags: named configurations of a kind, such as `nvidia/h100`.

A tag is an entry of an `AttrRegistry` whose metadata is a config dict
(`{"kind": "cuda", "arch": "sm_90", ...}`), checked against its kind's options
when it is registered.
"""

from __future__ import annotations

from typing import Any

import attrs

from kiln.errors import RegistryError, TargetError
from kiln.registry.attr_registry import AttrRegistry, RegEntry, RegKey
from kiln.registry.site import Site
from kiln.target.kind import TargetKind


@attrs.frozen
class TargetTagMeta:
    """The tag's kind, its options, and what it names."""

    kind: str = ""
    options: tuple[tuple[str, Any], ...] = ()
    description: str = ""


class TargetTag(RegKey):
    """A named target configuration, interned like an `Op`."""

    __slots__ = ()

    @staticmethod
    def get(name: str) -> TargetTag:
        """Returns the tag named `name`; an unknown name lists the valid ones."""
        return _REGISTRY.get(name)

    @staticmethod
    def list_names() -> list[str]:
        """Returns every registered tag name."""
        return _REGISTRY.list_names()

    @property
    def kind(self) -> TargetKind:
        """The tag's target kind."""
        return TargetKind.get(_REGISTRY.meta(self).kind)

    @property
    def options(self) -> dict[str, Any]:
        """The options the tag sets."""
        return dict(_REGISTRY.meta(self).options)

    @property
    def description(self) -> str:
        """The hardware the tag names."""
        return _REGISTRY.meta(self).description


class TargetTagRegEntry(RegEntry[TargetTag]):
    """The registration of one tag."""

    def set_config(self, config: dict[str, Any], description: str = "") -> TargetTagRegEntry:
        """Sets the tag's kind and options; each option is checked against the kind."""
        if not isinstance(config, dict) or "kind" not in config:
            raise RegistryError(f"target tag {self.name}: config must be a dict with a 'kind', got {config!r}")
        kind = TargetKind.get(config["kind"])
        options = tuple(
            (kind.option(name).name, kind.option(name).convert(value, kind.name))
            for name, value in config.items()
            if name != "kind"
        )
        meta = TargetTagMeta(kind.name, options, description)
        _REGISTRY.update_meta(self.key, "set_config", lambda _: meta, Site.here())
        return self


_REGISTRY: AttrRegistry[TargetTagRegEntry, TargetTag, TargetTagMeta] = AttrRegistry(
    "target tag",
    TargetTag,
    TargetTagRegEntry,
    TargetTagMeta,
    name_pattern=r"[a-z0-9]+/[a-z0-9][a-z0-9.-]*",
    name_rule="target tag names are vendor/model, lower case, e.g. 'nvidia/h100'",
    unknown_error=TargetError,
)


def register_tag(name: str, config: dict[str, Any], description: str = "") -> TargetTagRegEntry:
    """Registers tag `name` with its config."""
    return _REGISTRY.register_or_get(name).set_config(config, description)


def tag_registry() -> AttrRegistry[TargetTagRegEntry, TargetTag, TargetTagMeta]:
    """Returns the global target-tag registry."""
    return _REGISTRY


def _nvidia(name: str, description: str, arch: str, smem_optin: int, sms: int) -> None:
    # Every NVIDIA GPU since Volta has 1024 threads and 64 Ki registers per block, warps of 32.
    register_tag(
        name,
        {
            "kind": "cuda",
            "arch": arch,
            "max-threads-per-block": 1024,
            "max-shared-memory-per-block": smem_optin,
            "thread-warp-size": 32,
            "registers-per-block": 65536,
            "multiprocessor-count": sms,
        },
        description,
    )


# Shared memory is the per-block opt-in maximum (cudaDevAttrMaxSharedMemoryPerBlockOptin);
# kernels above 48 KiB must ask for it with cudaFuncSetAttribute.
_nvidia("nvidia/h100", "NVIDIA H100 SXM5 (Hopper, 80 GB)", "sm_90", 232448, 132)
_nvidia("nvidia/h200", "NVIDIA H200 SXM (Hopper, 141 GB)", "sm_90", 232448, 132)
_nvidia("nvidia/a100", "NVIDIA A100 SXM4 (Ampere)", "sm_80", 166912, 108)
_nvidia("nvidia/l4", "NVIDIA L4 (Ada Lovelace)", "sm_89", 101376, 58)
_nvidia("nvidia/rtx-4090", "NVIDIA GeForce RTX 4090 (Ada Lovelace)", "sm_89", 101376, 128)
_nvidia("nvidia/rtx-3090", "NVIDIA GeForce RTX 3090 (Ampere)", "sm_86", 101376, 82)
