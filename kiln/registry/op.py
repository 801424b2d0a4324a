"""Operators: the interned `Op` key, its `OpRegEntry` chain, and `OpAttrMap`.

```python
(register_op("my.scale")
    .describe("x * factor")
    .set_num_inputs(1)
    .add_argument("data", "Tensor", "input")
    .set_attrs_type(ScaleAttrs)
    .add_type_rel("Identity", identity_rel)
    .set_attr(attr.TOpPattern, OpPattern.ELEMWISE))
Op.get("my.scale").get_attr(attr.TOpPattern)
```

Each chain step is one atomic, validated update; the order of the steps does
not matter. Completeness (as many arguments as declared inputs) is checked by
`Op.verify()`, at the end of every `deferred()` batch, and before an op is used.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar, overload

import attrs

from kiln.errors import RegistryError
from kiln.registry import attr
from kiln.registry.attr_registry import (
    AttrKey,
    AttrMap,
    AttrRegistry,
    RegEntry,
    RegKey,
)
from kiln.registry.batch import add_commit_check, mutation
from kiln.registry.site import Site

V = TypeVar("V")
D = TypeVar("D")


@attrs.frozen
class Argument:
    """One declared input of an op."""

    name: str
    type_info: str
    description: str


@attrs.frozen
class OpMeta:
    """Everything about an op that is not an attribute; replaced whole on each change."""

    description: str = ""
    arguments: tuple[Argument, ...] = ()
    num_inputs: int | None = None
    attrs_type: type | None = None
    support_level: int = 10
    sites: tuple[tuple[str, Site], ...] = ()  # where each field was first set

    def site_of(self, field: str) -> Site | None:
        """Returns where `field` was set, or None."""
        return dict(self.sites).get(field)


class Op(RegKey):
    """An operator, interned: `Op.get("add") is Op.get("add")`."""

    __slots__ = ()

    @staticmethod
    def get(name: str) -> Op:
        """Returns the op named `name`; an unknown name lists the closest registered ones."""
        return _REGISTRY.get(name)

    @staticmethod
    def list_names() -> list[str]:
        """Returns every registered op name, in registration order."""
        return _REGISTRY.list_names()

    @staticmethod
    def get_attr_map(key: AttrKey[V] | str) -> OpAttrMap[V]:
        """Returns the live column of attribute `key`: `map[op]`, `map.get(op, d)`, `op in map`."""
        return _REGISTRY.get_attr_map(key)

    @overload
    def get_attr(self, key: AttrKey[V]) -> V | None: ...
    @overload
    def get_attr(self, key: AttrKey[V], default: D) -> V | D: ...
    @overload
    def get_attr(self, key: str, default: Any = None) -> Any: ...

    def get_attr(self, key: AttrKey[Any] | str, default: Any = None) -> Any:
        """Returns this op's attribute `key`, or `default`."""
        return _REGISTRY.get_attr(key, self, default)

    def has_attr(self, key: AttrKey[Any] | str) -> bool:
        """Whether this op (not any op) carries attribute `key`."""
        return _REGISTRY.slot(key, self) is not None

    def set_attr(self, key: AttrKey[Any] | str, value: object, plevel: int = 10) -> OpRegEntry:
        """Sets attribute `key` of this op (TVM's `Op.set_attr`); a higher plevel overrides a lower one."""
        return OpRegEntry(self).set_attr(key, value, plevel)

    def reset_attr(self, key: AttrKey[Any] | str, plevel: int | None = None) -> OpRegEntry:
        """Removes attribute `key` from this op: every plevel, or only the value set at `plevel`."""
        return OpRegEntry(self).reset_attr(key, plevel)

    @property
    def meta(self) -> OpMeta:
        """The op's metadata record."""
        return _REGISTRY.meta(self)

    @property
    def description(self) -> str:
        """What the op computes."""
        return self.meta.description

    @property
    def arguments(self) -> tuple[Argument, ...]:
        """The declared inputs, in order."""
        return self.meta.arguments

    @property
    def num_inputs(self) -> int | None:
        """The declared input count, else the number of arguments, else None."""
        meta = self.meta
        if meta.num_inputs is not None:
            return meta.num_inputs
        return len(meta.arguments) if meta.arguments else None

    @property
    def attrs_type(self) -> type | None:
        """The attrs class of the op's calls, or None for ops without attributes."""
        return self.meta.attrs_type

    @property
    def support_level(self) -> int:
        """How basic the op is (1 = core, 10 = experimental), as in TVM."""
        return self.meta.support_level

    def verify(self) -> None:
        """Raises RegistryError if the op's declaration is incomplete."""
        meta = self.meta
        if meta.num_inputs is not None and meta.arguments and len(meta.arguments) != meta.num_inputs:
            raise RegistryError(
                f"op {self.name} declares {meta.num_inputs} inputs (at {meta.site_of('num_inputs')}) "
                f"but has {len(meta.arguments)} arguments: "
                + ", ".join(a.name for a in meta.arguments)
            )


OpAttrMap = AttrMap[Op, V]


class OpRegEntry(RegEntry[Op]):
    """The chainable registration of one op."""

    def _update(self, field: str, action: str, change: Callable[[OpMeta], OpMeta]) -> OpRegEntry:
        site = Site.here()

        def apply(meta: OpMeta) -> OpMeta:
            new = change(meta)
            if meta.site_of(field) is None:
                new = attrs.evolve(new, sites=(*new.sites, (field, site)))
            return new

        _REGISTRY.update_meta(self.key, action, apply, site)
        return self

    def _set_once(
        self, field: str, value: object, check: Callable[[OpMeta], None] | None = None
    ) -> OpRegEntry:
        """Sets a metadata field; setting it again to another value is an error."""

        def change(meta: OpMeta) -> OpMeta:
            if check is not None:
                check(meta)
            old = getattr(meta, field)
            if meta.site_of(field) is not None and old != value:
                raise RegistryError(
                    f"op {self.name}: {field} is set to {old!r} at {meta.site_of(field)}; "
                    f"refusing to change it to {value!r}"
                )
            changes: dict[str, Any] = {field: value}
            return attrs.evolve(meta, **changes)

        return self._update(field, f"set_{field}", change)

    def describe(self, text: str) -> OpRegEntry:
        """Sets the op's description."""
        if not isinstance(text, str) or not text.strip():
            raise RegistryError(f"op {self.name}: describe() expects a non-empty string, got {text!r}")
        return self._set_once("description", text)

    def add_argument(self, name: str, type_info: str, description: str = "") -> OpRegEntry:
        """Declares the next input: its name, its type in words, and what it is."""
        if not isinstance(name, str) or not name.isidentifier():
            raise RegistryError(f"op {self.name}: argument name must be an identifier, got {name!r}")
        if not isinstance(type_info, str) or not type_info:
            raise RegistryError(f"op {self.name}: argument {name} needs a type such as 'Tensor', got {type_info!r}")

        def change(meta: OpMeta) -> OpMeta:
            if any(a.name == name for a in meta.arguments):
                raise RegistryError(f"op {self.name}: argument {name!r} is declared twice")
            if meta.num_inputs is not None and len(meta.arguments) >= meta.num_inputs:
                raise RegistryError(
                    f"op {self.name}: argument {name!r} would be input {len(meta.arguments) + 1}, "
                    f"but the op declares {meta.num_inputs} inputs (at {meta.site_of('num_inputs')})"
                )
            return attrs.evolve(meta, arguments=(*meta.arguments, Argument(name, type_info, description)))

        return self._update("arguments", "add_argument", change)

    def set_num_inputs(self, n: int) -> OpRegEntry:
        """Declares how many inputs the op takes; must agree with `add_argument`."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise RegistryError(f"op {self.name}: set_num_inputs expects an int >= 0, got {n!r}")

        def check(meta: OpMeta) -> None:
            if len(meta.arguments) > n:
                raise RegistryError(
                    f"op {self.name}: set_num_inputs({n}) but {len(meta.arguments)} arguments are declared: "
                    + ", ".join(a.name for a in meta.arguments)
                )

        return self._set_once("num_inputs", n, check)

    def set_attrs_type(self, cls: type) -> OpRegEntry:
        """Sets the attrs class of the op's calls (a frozen `attrs` class)."""
        if not (isinstance(cls, type) and attrs.has(cls)):
            raise RegistryError(
                f"op {self.name}: set_attrs_type expects an attrs class (decorated with @attrs.frozen), got {cls!r}"
            )
        return self._set_once("attrs_type", cls)

    def set_support_level(self, level: int) -> OpRegEntry:
        """Sets the support level (1 = core ... 10 = experimental)."""
        if isinstance(level, bool) or not isinstance(level, int) or not 0 <= level <= 10:
            raise RegistryError(f"op {self.name}: support level must be an int in [0, 10], got {level!r}")
        return self._set_once("support_level", level)

    def add_type_rel(self, name: str, fn: Callable[..., Any], plevel: int = 10) -> OpRegEntry:
        """Sets the op's type relation (attribute FTypeRelation), labelled `name`."""
        if not isinstance(name, str) or not name:
            raise RegistryError(f"op {self.name}: type relation needs a name, got {name!r}")
        _REGISTRY.update_attr(attr.FTypeRelation, self.key, attr.TypeRelation(name, fn), plevel, Site.here())
        return self

    def set_attr(self, key: AttrKey[Any] | str, value: object, plevel: int = 10) -> OpRegEntry:
        """Sets attribute `key` to `value`; a higher plevel overrides a lower one."""
        super().set_attr(key, value, plevel)
        return self

    def add_implementation(
        self,
        name: str,
        compute: attr.Compute,
        schedule: attr.Schedule | None = None,
        *,
        target: str = "*",
        dtypes: Iterable[str] | None = None,
        label: str | None = None,
        priority: int = 10,
        plevel: int = 10,
    ) -> OpRegEntry:
        """Adds an implementation of the op: sets its `FStrategy[target:name]` at `plevel`.

        Args:
            name: the implementation's name, unique per op and target.
            compute: `(attrs, inputs, out_type) -> list of te tensors`.
            schedule: `(sch, anchor_outs, outs, target) -> None`; None for the target's default schedule.
            target: a target kind name, or "*" for every target.
            dtypes: the dtypes every tensor input must have; None for any.
            label: a label that `relay.backend.use_label` can force.
            priority: orders implementations of one plevel (higher wins).
            plevel: the attribute's plevel (a higher one overrides, as for every attribute).
        """
        where = f"implementation {name!r} of op {self.name!r}"
        if not isinstance(name, str) or not name:
            raise RegistryError(f"implementation of op {self.name!r}: name must be a non-empty string, got {name!r}")
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise RegistryError(f"{where}: priority must be an int, got {priority!r}")
        if not callable(compute) or not (schedule is None or callable(schedule)):
            raise RegistryError(f"{where}: compute must be a callable and schedule a callable or None")
        site = Site.here()
        impl = attr.Implementation(self.name, name, compute, schedule, target,
                                   None if dtypes is None else frozenset(dtypes), label, priority, plevel, site)
        _REGISTRY.update_attr(attr.FStrategy[f"{target}:{name}"], self.key, impl, plevel, site)
        return self

    def reset_attr(self, key: AttrKey[Any] | str, plevel: int | None = None) -> OpRegEntry:
        """Removes attribute `key` from the op: every plevel, or only the value set at `plevel`."""
        super().reset_attr(key, plevel)
        return self


_REGISTRY: AttrRegistry[OpRegEntry, Op, OpMeta] = AttrRegistry(
    "op",
    Op,
    OpRegEntry,
    OpMeta,
    name_pattern=r"[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)*",
    name_rule="op names are lower snake_case with an optional dotted family, e.g. 'add' or 'nn.conv2d'",
)
for _key in attr.OP_ATTR_KEYS:
    _REGISTRY.declare_key(_key)


def _verify_op(key: RegKey) -> None:
    assert isinstance(key, Op)
    key.verify()


add_commit_check("op", _verify_op)


class OpAlreadyExistsError(RegistryError):
    """`register_op` of a name that is defined already (TensorFlow's AlreadyExists)."""


def register_op(name: str) -> OpRegEntry:
    """Defines the op `name` and returns its entry for a `set_attr` chain.

    A second definition of the same name is an error naming both sites; to add
    attributes to an op that exists, use `Op.get(name).set_attr(...)` (or
    `op_registry().register_or_get(name)`, TVM's get-or-create).

    Raises:
        OpAlreadyExistsError: when `name` is defined already.
    """
    site = Site.here()
    with mutation():
        existing = _REGISTRY.find(name)
        if existing is not None:
            message = (f"op {name!r} is defined twice: first at {_REGISTRY.created_at(existing)}, again at {site}; "
                       f"to add attributes to it, use Op.get({name!r}).set_attr(...)")
            _REGISTRY._emit(name, "register", "error", site, message=message)
            raise OpAlreadyExistsError(message)
        return _REGISTRY.register_or_get(name)


def declare_attr_key(
    name: str, expects: str, check: Callable[[object], bool], doc: str = ""
) -> AttrKey[Any]:
    """Declares a new op attribute key; returns the constant to use in `set_attr`."""
    return _REGISTRY.declare_key(AttrKey(name, expects, check, doc))


def op_registry() -> AttrRegistry[OpRegEntry, Op, OpMeta]:
    """Returns the global op registry."""
    return _REGISTRY
