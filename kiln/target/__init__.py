"""Targets: what to compile for (`Target`), the kinds and tags it is made from, host detection."""

from kiln.target.detect import HostCPU, cuda_device, host_cpu
from kiln.target.kind import (
    FBuild,
    FDefaultSchedule,
    FTargetParser,
    Option,
    TargetKind,
    TargetKindRegEntry,
    TDeviceType,
    kind_registry,
    register_target_kind,
)
from kiln.target.tag import TargetTag, TargetTagRegEntry, register_tag, tag_registry
from kiln.target.target import Target

__all__ = [
    "FBuild",
    "FDefaultSchedule",
    "FTargetParser",
    "HostCPU",
    "Option",
    "TDeviceType",
    "Target",
    "TargetKind",
    "TargetKindRegEntry",
    "TargetTag",
    "TargetTagRegEntry",
    "cuda_device",
    "host_cpu",
    "kind_registry",
    "register_tag",
    "register_target_kind",
    "tag_registry",
]
