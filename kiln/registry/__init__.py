"""The attribute registry: ops, their attributes, and the generic registry under them.

See DESIGN.md, "The registry, as users see it". `Op`, `register_op` and the
attribute keys in `attr` are the everyday API; `AttrRegistry` is the generic
machinery that the target kinds and tags reuse.
"""

from kiln.registry import attr
from kiln.registry.attr import Implementation, OpPattern, TypeRelation
from kiln.registry.attr_registry import (
    AttrKey,
    AttrMap,
    AttrRegistry,
    RegEntry,
    RegKey,
    Slot,
    instance_of,
    is_callable,
)
from kiln.registry.batch import RegistrationEvent, add_watcher, deferred, remove_watcher, scope
from kiln.registry.export import export_json, format_op, format_table, op_record
from kiln.registry.impl import NoImplementationError, implementations, register_implementation
from kiln.registry.op import (
    Argument,
    Op,
    OpAlreadyExistsError,
    OpAttrMap,
    OpMeta,
    OpRegEntry,
    declare_attr_key,
    op_registry,
    register_op,
)
from kiln.registry.site import Site, foreign_registration, mark_registration_helper

__all__ = [
    "Argument",
    "AttrKey",
    "Implementation",
    "NoImplementationError",
    "AttrMap",
    "AttrRegistry",
    "Op",
    "OpAlreadyExistsError",
    "OpAttrMap",
    "OpMeta",
    "OpPattern",
    "OpRegEntry",
    "RegEntry",
    "RegKey",
    "RegistrationEvent",
    "Site",
    "Slot",
    "TypeRelation",
    "add_watcher",
    "attr",
    "declare_attr_key",
    "deferred",
    "export_json",
    "format_op",
    "format_table",
    "implementations",
    "instance_of",
    "is_callable",
    "foreign_registration",
    "mark_registration_helper",
    "op_record",
    "op_registry",
    "register_implementation",
    "register_op",
    "remove_watcher",
    "scope",
]
