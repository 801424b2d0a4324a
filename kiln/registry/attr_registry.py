"""The generic attribute registry: named entries whose attributes live in columns.

This is TVM's `AttrRegistry<EntryType, KeyType>` in Python. Each registry holds
named entries in registration order; each entry has an interned key object (an
`Op`, a `TargetKind`, a `TargetTag`) and an immutable metadata record. Attributes
are stored by column: one list per attribute key, indexed by the entry's
registration index, each slot a `Slot(value, plevel, site)`. A pass asks one
question of one column.

Every registry joins the batches, scopes and watchers of `batch.py` and shares
its lock.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterator
from typing import Any, ClassVar, Generic, TypeVar, cast, overload

import attrs

from kiln.errors import (
    AttrValueError,
    DuplicateAttrError,
    RegistryError,
    UnknownNameError,
    did_you_mean,
)
from kiln.registry.batch import LOCK as _LOCK
from kiln.registry.batch import RegistrationEvent, add_registry, emit, mutation, registries, touch
from kiln.registry.site import Site

V = TypeVar("V")
D = TypeVar("D")
KeyT = TypeVar("KeyT", bound="RegKey")
EntryT = TypeVar("EntryT", bound="RegEntry[Any]")
MetaT = TypeVar("MetaT")

# ---------------------------------------------------------------------------
# Registration sites
# ---------------------------------------------------------------------------

_SEQUENCE = itertools.count()  # orders every attribute set, so "the latest among equals" is well defined


@attrs.frozen
class Slot(Generic[V]):
    """One attribute value of one entry, with the plevel and site that set it.

    `below` holds the values of lower plevels that this one overrides (highest
    first), so that `reset_attr(key, plevel=p)` of an override shows again
    what it hid.
    """

    value: V
    plevel: int
    site: Site
    seq: int = attrs.field(factory=lambda: next(_SEQUENCE), eq=False, repr=False)
    below: tuple[Slot[V], ...] = attrs.field(default=(), eq=False, repr=False)

    def levels(self) -> tuple[Slot[V], ...]:
        """This slot and the ones it hides, highest plevel first (each without its own `below`)."""
        return (attrs.evolve(self, below=()), *self.below)


def _stack(levels: list[Slot[Any]]) -> Slot[Any] | None:
    """The slot that shows for `levels` (highest plevel first): the top, hiding the rest."""
    return attrs.evolve(levels[0], below=tuple(levels[1:])) if levels else None


# ---------------------------------------------------------------------------
# Attribute keys
# ---------------------------------------------------------------------------


_QUALIFIER = re.compile(r"[A-Za-z0-9_.*-]+(:[A-Za-z0-9_.*-]+)*")


@attrs.frozen
class AttrKey(Generic[V]):
    """A named attribute key and the kind of value it accepts.

    Keys are module constants (`attr.TOpPattern`), so a typo fails at import;
    `check` refuses a value of the wrong kind at registration. A key with
    `qualified_by` is also a family of keys: `attr.FSchedule["cuda"]` is the
    column `FSchedule[cuda]`, a value for one target kind beside the plain
    `FSchedule` for all of them.
    """

    name: str
    expects: str  # what a valid value is, in words: "an OpPattern", "a callable"
    check: Callable[[object], bool] = attrs.field(eq=False, repr=False)
    doc: str = attrs.field(default="", eq=False, repr=False)
    qualified_by: str = attrs.field(default="", eq=False, repr=False)  # what a qualifier names, in words
    base: AttrKey[V] | None = attrs.field(default=None, eq=False, repr=False)

    def __getitem__(self, qualifier: str) -> AttrKey[V]:
        """The member of this family for `qualifier` (a target kind name, ...)."""
        if not self.qualified_by or self.base is not None:
            raise AttrValueError(f"attribute key {self.name} takes no qualifier, got [{qualifier!r}]")
        if not isinstance(qualifier, str) or not _QUALIFIER.fullmatch(qualifier):
            raise AttrValueError(
                f"attribute key {self.name} is qualified by {self.qualified_by}: "
                f"letters, digits, '_', '.', '-', '*' and ':', got {qualifier!r}"
            )
        return AttrKey(f"{self.name}[{qualifier}]", self.expects, self.check, self.doc, "", self)

    @property
    def qualifier(self) -> str | None:
        """The qualifier of a family member (`"cuda"` for `FSchedule[cuda]`), else None."""
        return None if self.base is None else self.name[len(self.base.name) + 1 : -1]

    def validate(self, value: object, owner: str) -> None:
        """Raises AttrValueError naming `owner` unless `value` is valid for this key."""
        if not self.check(value):
            raise AttrValueError(
                f"attribute {self.name} of {owner} expects {self.expects}, "
                f"got {type(value).__name__} {value!r:.80}"
            )


def instance_of(*types: type) -> Callable[[object], bool]:
    """A key check accepting instances of `types` (bool is never taken for int)."""

    def check(value: object) -> bool:
        if isinstance(value, bool) and bool not in types:
            return False
        return isinstance(value, types)

    return check


def is_callable(value: object) -> bool:
    """A key check accepting any callable."""
    return callable(value)


# ---------------------------------------------------------------------------
# Keys and entries
# ---------------------------------------------------------------------------


class RegKey:
    """An interned handle to one entry: its name and registration index.

    Keys compare by identity; `Op.get("add") is Op.get("add")`. Everything else
    about the entry lives in its registry, so snapshots stay cheap.
    """

    __slots__ = ("_registry", "index", "name")

    def __init__(self, registry: AttrRegistry[Any, Any, Any], name: str, index: int) -> None:
        self.name = name
        self.index = index
        self._registry = registry

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_lookup_key, (self._registry.kind, self.name))


def _lookup_key(kind: str, name: str) -> RegKey:
    key: RegKey = AttrRegistry.by_kind(kind).get(name)
    return key


class RegEntry(Generic[KeyT]):
    """A registration handle: chainable setters for one entry (TVM's `*RegEntry`)."""

    _registration_api = True  # sites skip the frames of its methods

    def __init__(self, key: KeyT) -> None:
        self.key = key

    @property
    def name(self) -> str:
        """The entry's registered name."""
        return self.key.name

    def _registry(self) -> AttrRegistry[Any, Any, Any]:
        return self.key._registry

    def set_attr(self, key: AttrKey[Any] | str, value: object, plevel: int = 10) -> RegEntry[KeyT]:
        """Sets attribute `key` to `value`; a higher plevel overrides a lower one."""
        self._registry().update_attr(key, self.key, value, plevel, Site.here())
        return self

    def reset_attr(self, key: AttrKey[Any] | str, plevel: int | None = None) -> RegEntry[KeyT]:
        """Removes attribute `key` from this entry: every plevel, or only the value set at `plevel`."""
        self._registry().reset_attr(key, self.key, Site.here(), plevel)
        return self

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


@attrs.frozen
class _State:
    names: dict[str, int]
    keys: list[Any]
    metas: list[Any]
    created: list[Site]
    columns: dict[str, list[Slot[Any] | None]]
    attr_keys: dict[str, AttrKey[Any]]


class AttrRegistry(Generic[EntryT, KeyT, MetaT]):
    """One registry of named entries with column-stored attributes.

    Args:
        kind: what the entries are, in words ("op", "target kind"); used in errors.
        key_type: the interned key class (subclass of `RegKey`).
        entry_type: the chainable registration class (subclass of `RegEntry`).
        meta_type: an attrs class whose no-argument instance is a new entry's metadata.
        name_pattern: a regex every entry name must match, and `name_rule` says it in words.
        unknown_error: the error class that `get` raises for an unknown name.
    """

    _registration_api = True
    _by_entry: ClassVar[dict[type, AttrRegistry[Any, Any, Any]]] = {}

    def __init__(
        self,
        kind: str,
        key_type: type[KeyT],
        entry_type: type[EntryT],
        meta_type: Callable[[], MetaT],
        name_pattern: str,
        name_rule: str,
        unknown_error: type[Exception] = UnknownNameError,
    ) -> None:
        self.kind = kind
        self._key_type = key_type
        self._entry_type = entry_type
        self._meta_type = meta_type
        self._name_re = re.compile(name_pattern)
        self._name_rule = name_rule
        self._unknown_error = unknown_error
        self._names: dict[str, int] = {}
        self._keys: list[KeyT] = []
        self._metas: list[MetaT] = []
        self._created: list[Site] = []  # where each entry was first registered
        self._columns: dict[str, list[Slot[Any] | None]] = {}
        self._attr_keys: dict[str, AttrKey[Any]] = {}
        with _LOCK:
            add_registry(kind, self)
            AttrRegistry._by_entry[entry_type] = self

    # -- the one registry per entry type ----------------------------------

    @staticmethod
    def global_(entry_type: type[EntryT]) -> AttrRegistry[EntryT, Any, Any]:
        """Returns the one registry whose entries are `entry_type`."""
        try:
            return AttrRegistry._by_entry[entry_type]
        except KeyError:
            raise UnknownNameError(f"no registry holds entries of type {entry_type.__name__}") from None

    @staticmethod
    def by_kind(kind: str) -> AttrRegistry[Any, Any, Any]:
        """Returns the registry of `kind` ("op", "target kind", "target tag")."""
        found = registries().get(kind)
        if not isinstance(found, AttrRegistry):
            raise UnknownNameError(f"no registry of kind {kind!r}{did_you_mean(kind, registries())}")
        return found

    # -- entries ------------------------------------------------------------

    def register_or_get(self, name: str) -> EntryT:
        """Returns the entry named `name`, registering it first if it is new."""
        site = Site.here()
        with mutation():
            if not isinstance(name, str) or not self._name_re.fullmatch(name):
                message = f"invalid {self.kind} name {name!r}: {self._name_rule}"
                self._emit(str(name), "register", "error", site, message=message)
                raise RegistryError(message)
            index = self._names.get(name)
            if index is None:
                index = len(self._keys)
                self._keys.append(self._key_type(self, name, index))
                self._metas.append(self._meta_type())
                self._created.append(site)
                self._names[name] = index
                self._touch(name)
                self._emit(name, "register", "ok", site)
            return self._entry_type(self._keys[index])

    def created_at(self, key: KeyT) -> Site:
        """Where `key` was first registered."""
        with _LOCK:
            self._check(key)
            return self._created[key.index]

    def get(self, name: str) -> KeyT:
        """Returns the key named `name`; an unknown name lists the closest ones."""
        with _LOCK:
            index = self._names.get(name)
            if index is not None:
                return self._keys[index]
            names = list(self._names)
        if len(names) <= 12:
            known = f"known {self.kind}s: {', '.join(names)}"
        else:
            known = f"{len(names)} {self.kind}s are registered"
        raise self._unknown_error(f"unknown {self.kind} {name!r}{did_you_mean(name, names)}; {known}")

    def find(self, name: str) -> KeyT | None:
        """Returns the key named `name`, or None."""
        with _LOCK:
            index = self._names.get(name)
            return None if index is None else self._keys[index]

    def list_names(self) -> list[str]:
        """Returns every registered name, in registration order."""
        with _LOCK:
            return list(self._names)

    def list_keys(self) -> list[KeyT]:
        """Returns every registered key, in registration order."""
        with _LOCK:
            return list(self._keys)

    def __len__(self) -> int:
        with _LOCK:
            return len(self._keys)

    def _check(self, key: KeyT) -> None:
        """Refuses keys of other registries and keys that a scope has removed."""
        if not (key.index < len(self._keys) and self._keys[key.index] is key):
            raise RegistryError(
                f"{key!r} is not registered in the {self.kind} registry "
                "(it was registered inside a registry.scope() that has since closed)"
            )

    # -- metadata -----------------------------------------------------------

    def meta(self, key: KeyT) -> MetaT:
        """Returns the metadata record of `key` (immutable)."""
        with _LOCK:
            self._check(key)
            return self._metas[key.index]

    def update_meta(self, key: KeyT, action: str, change: Callable[[MetaT], MetaT], site: Site) -> None:
        """Replaces the metadata of `key` by `change(old)`, atomically.

        `change` validates and may raise RegistryError; nothing changes then.
        """
        with mutation():
            self._check(key)
            try:
                new = change(self._metas[key.index])
            except RegistryError as err:
                self._emit(key.name, action, "error", site, message=str(err))
                raise
            self._metas[key.index] = new
            self._touch(key.name)
            self._emit(key.name, action, "ok", site)

    # -- attribute keys -------------------------------------------------------

    def declare_key(self, key: AttrKey[V]) -> AttrKey[V]:
        """Makes `key` known to this registry, so its name can be used as a string."""
        with _LOCK:
            old = self._attr_keys.get(key.name)
            if old is not None and old is not key:
                raise RegistryError(f"attribute key {key.name!r} is declared already for {self.kind}s")
            self._attr_keys[key.name] = key
        return key

    def attr_key(self, key: AttrKey[V] | str) -> AttrKey[V]:
        """Resolves a declared key, or a declared key's name; an unknown name lists the closest.

        A family member (`FSchedule[cuda]`, or that string) resolves through its declared family.
        """
        name = key.name if isinstance(key, AttrKey) else key
        family, bracket, rest = name.partition("[")
        if bracket and rest.endswith("]"):
            base: AttrKey[V] = self.attr_key(family)
            if isinstance(key, AttrKey):
                if key.base is not base:
                    raise UnknownNameError(f"attribute key {name!r} is not a member of the declared {family}")
                return key
            return base[rest[:-1]]
        with _LOCK:
            found = self._attr_keys.get(name)
            names = list(self._attr_keys)
        if found is None or (isinstance(key, AttrKey) and found is not key):
            raise UnknownNameError(
                f"unknown {self.kind} attribute key {name!r}{did_you_mean(name, names)}; "
                "declare new keys with registry.declare_attr_key"
            )
        return found

    def list_attr_keys(self) -> list[AttrKey[Any]]:
        """Returns the declared attribute keys."""
        with _LOCK:
            return list(self._attr_keys.values())

    # -- attributes -----------------------------------------------------------

    def update_attr(
        self, attr: AttrKey[Any] | str, key: KeyT, value: object, plevel: int = 10, site: Site | None = None
    ) -> None:
        """Sets attribute `attr` of `key` to `value` at `plevel`.

        A higher plevel overrides a lower one, a lower one is ignored, and the
        same plevel twice is an error naming both registration sites.
        """
        site = site or Site.here()
        attr_key = self.attr_key(attr)
        owner = f"{self.kind} {key.name}"
        with mutation():
            self._check(key)
            try:
                if isinstance(plevel, bool) or not isinstance(plevel, int) or plevel < 0:
                    raise AttrValueError(
                        f"plevel of attribute {attr_key.name} of {owner} must be an int >= 0, got {plevel!r}"
                    )
                attr_key.validate(value, owner)
            except RegistryError as err:
                self._emit(key.name, "set_attr", "error", site, attr_key.name, plevel, str(err))
                raise
            column = self._columns.setdefault(attr_key.name, [])
            if len(column) <= key.index:
                column.extend([None] * (key.index + 1 - len(column)))
            old = column[key.index]
            levels = [] if old is None else list(old.levels())
            same = next((lv for lv in levels if lv.plevel == plevel), None)
            if same is not None:
                message = (
                    f"attribute {attr_key.name} of {owner} is set twice at plevel {plevel}: "
                    f"first at {same.site}, again at {site}; use a higher plevel to override"
                )
                self._emit(key.name, "set_attr", "error", site, attr_key.name, plevel, message)
                raise DuplicateAttrError(message)
            levels.append(Slot(value, plevel, site))
            levels.sort(key=lambda lv: -lv.plevel)
            column[key.index] = _stack(levels)
            self._touch(key.name)
            if old is not None and old.plevel > plevel:  # kept below, shown if the higher ones are reset
                self._emit(
                    key.name, "set_attr", "ignored", site, attr_key.name, plevel,
                    f"plevel {old.plevel} set at {old.site} wins",
                )
                return
            self._emit(key.name, "set_attr", "ok" if old is None else "overridden", site, attr_key.name, plevel)

    def reset_attr(
        self, attr: AttrKey[Any] | str, key: KeyT, site: Site | None = None, plevel: int | None = None
    ) -> None:
        """Removes attribute `attr` from `key`: every value, or with `plevel` the one set at that plevel
        (an override reset shows again the value it hid)."""
        site = site or Site.here()
        attr_key = self.attr_key(attr)
        with mutation():
            self._check(key)
            column = self._columns.get(attr_key.name, [])
            if key.index < len(column):
                old = column[key.index]
                keep = [] if old is None or plevel is None else [lv for lv in old.levels() if lv.plevel != plevel]
                column[key.index] = _stack(keep)
            self._touch(key.name)
            self._emit(key.name, "reset_attr", "ok", site, attr_key.name, plevel)

    def slot(self, attr: AttrKey[Any] | str, key: KeyT) -> Slot[Any] | None:
        """Returns the slot of `attr` for `key` (value, plevel, site), or None."""
        # The hot path of every pass that asks an attribute map: keep it flat.
        name = attr.name if isinstance(attr, AttrKey) else self.attr_key(attr).name
        index = key.index
        with _LOCK:
            if index >= len(self._keys) or self._keys[index] is not key:
                self._check(key)
            column = self._columns.get(name)
            if column is None or index >= len(column):
                return None
            return column[index]

    @overload
    def get_attr(self, attr: AttrKey[V], key: KeyT) -> V | None: ...
    @overload
    def get_attr(self, attr: AttrKey[V], key: KeyT, default: D) -> V | D: ...
    @overload
    def get_attr(self, attr: str, key: KeyT, default: Any = None) -> Any: ...

    def get_attr(self, attr: AttrKey[Any] | str, key: KeyT, default: Any = None) -> Any:
        """Returns attribute `attr` of `key`, or `default` when it has none."""
        found = self.slot(attr, key)
        return default if found is None else found.value

    def attrs_of(self, key: KeyT) -> dict[str, Slot[Any]]:
        """Returns every attribute that `key` carries, by key name."""
        with _LOCK:
            self._check(key)
            found: dict[str, Slot[Any]] = {}
            for name, column in self._columns.items():
                slot = column[key.index] if key.index < len(column) else None
                if slot is not None:
                    found[name] = slot
            return found

    def family_slots(self, family: AttrKey[V], key: KeyT) -> dict[str, Slot[V]]:
        """The members of `family` that `key` carries, by qualifier, in the order they were set."""
        base = self.attr_key(family)
        prefix = base.name + "["
        found = [(name[len(prefix) : -1], slot) for name, slot in self.attrs_of(key).items() if name.startswith(prefix)]
        return dict(sorted(found, key=lambda item: item[1].seq))

    def get_attr_map(self, attr: AttrKey[V] | str) -> AttrMap[KeyT, V]:
        """Returns a live view of one attribute column."""
        return AttrMap(self, self.attr_key(attr))

    # -- snapshots ------------------------------------------------------------

    def _snapshot(self) -> _State:
        return _State(
            dict(self._names),
            list(self._keys),
            list(self._metas),
            list(self._created),
            {name: list(column) for name, column in self._columns.items()},
            dict(self._attr_keys),
        )

    def _restore(self, state: _State) -> None:
        self._names = dict(state.names)
        self._keys = list(state.keys)
        self._metas = list(state.metas)
        self._created = list(state.created)
        self._columns = {name: list(column) for name, column in state.columns.items()}
        self._attr_keys = dict(state.attr_keys)

    # -- events ---------------------------------------------------------------

    def _touch(self, name: str) -> None:
        touch(self.kind, name)

    def _emit(
        self,
        name: str,
        action: str,
        outcome: str,
        site: Site,
        attr: str | None = None,
        plevel: int | None = None,
        message: str = "",
    ) -> None:
        emit(RegistrationEvent(self.kind, name, action, outcome, site, attr, plevel, message))


class AttrMap(Generic[KeyT, V]):
    """A live view of one attribute column: `map[key]`, `map.get`, `in`, `len`, iteration."""

    def __init__(self, registry: AttrRegistry[Any, KeyT, Any], key: AttrKey[V]) -> None:
        self._registry = registry
        self.attr_key = key

    def _column(self) -> list[Slot[Any] | None]:
        return self._registry._columns.get(self.attr_key.name, [])

    def __getitem__(self, key: KeyT) -> V:
        slot = self._registry.slot(self.attr_key, key)
        if slot is None:
            have = [k.name for k in self]
            raise UnknownNameError(
                f"{self._registry.kind} {key.name} has no attribute {self.attr_key.name} "
                f"({len(have)} {self._registry.kind}s have it)"
            )
        return cast(V, slot.value)

    @overload
    def get(self, key: KeyT) -> V | None: ...
    @overload
    def get(self, key: KeyT, default: D) -> V | D: ...

    def get(self, key: KeyT, default: Any = None) -> Any:
        """Returns the value for `key`, or `default`."""
        slot = self._registry.slot(self.attr_key, key)
        return default if slot is None else slot.value

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, RegKey) or key._registry is not self._registry:
            return False
        return self._registry.slot(self.attr_key, cast(KeyT, key)) is not None

    def items(self) -> list[tuple[KeyT, V]]:
        """Returns (key, value) for every entry that has this attribute."""
        with _LOCK:
            keys = self._registry._keys
            return [(keys[i], cast(V, s.value)) for i, s in enumerate(self._column()) if s is not None]

    def __iter__(self) -> Iterator[KeyT]:
        return iter([key for key, _ in self.items()])

    def __len__(self) -> int:
        with _LOCK:
            return sum(1 for slot in self._column() if slot is not None)

    def __repr__(self) -> str:
        return f"AttrMap({self.attr_key.name}, {len(self)} {self._registry.kind}s)"


