"""`Target`: what to compile for, parsed from a string, a dict or a tag.

```python
Target("llvm")                              # the host CPU, detected
Target("llvm -mcpu=znver4 -num-cores=2")
Target("cuda -arch=sm_90")
Target({"kind": "cuda", "arch": "sm_80"})
Target("nvidia/h100")                       # a tag, optionally with -overrides
```

`str(target)` parses back to an equal target. Two targets are equal when they
have the same kind and options, i.e. when they compile the same code.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from types import MappingProxyType, TracebackType
from typing import Any

from kiln.errors import TargetError
from kiln.target.kind import FBuild, FTargetParser, TargetKind
from kiln.target.tag import TargetTag

_CURRENT = threading.local()


def _stack() -> list[Target]:
    stack: list[Target] | None = getattr(_CURRENT, "stack", None)
    if stack is None:
        stack = _CURRENT.stack = []
    return stack


class Target:
    """A compilation target: a kind, its options, and the tag it came from, if any."""

    __slots__ = ("attrs", "kind", "tag")

    kind: TargetKind
    attrs: Mapping[str, Any]
    tag: str | None

    def __init__(self, spec: str | Mapping[str, Any] | Target) -> None:
        if isinstance(spec, Target):
            self.kind, self.attrs, self.tag = spec.kind, spec.attrs, spec.tag
            return
        given: dict[str, Any]
        if isinstance(spec, str):
            head, given = _split(spec)
        elif isinstance(spec, Mapping):
            given = dict(spec)
            if ("kind" in given) == ("tag" in given):
                raise TargetError(f"a target dict has either a 'kind' or a 'tag', got {dict(spec)!r}")
            named = given.pop("tag", None) or given.pop("kind")
            if not isinstance(named, str):
                raise TargetError(f"a target's kind or tag is a string, got {named!r}")
            head = named
        else:
            raise TargetError(f"a target is a string, a dict or a Target, got {type(spec).__name__} {spec!r}")
        self.tag = None
        opts: dict[str, Any] = {}
        if "/" in head:
            tag = TargetTag.get(head)
            self.tag = tag.name
            self.kind = tag.kind
            opts.update(tag.options)
        else:
            self.kind = TargetKind.get(head)
        for name, value in given.items():
            option = self.kind.option(name)
            if value is None and option.type != "bool":
                raise TargetError(f"option -{option.name} of target kind {self.kind.name} needs a value: "
                                  f"-{option.name}=...")
            opts[option.name] = option.convert(True if value is None else value, self.kind.name)
        parser = self.kind.get_attr(FTargetParser)
        if parser is not None:
            opts = dict(parser(opts))
        for option in self.kind.options:
            if opts.get(option.name) is None and option.default is not None:
                opts[option.name] = option.default
        ordered = {o.name: opts[o.name] for o in self.kind.options if opts.get(o.name) is not None}
        self.attrs = MappingProxyType(ordered)

    # -- access ------------------------------------------------------------------

    def __getitem__(self, name: str) -> Any:
        option = self.kind.option(name)
        if option.name not in self.attrs:
            raise TargetError(f"target {self} does not set option -{option.name}")
        return self.attrs[option.name]

    def get(self, name: str, default: Any = None) -> Any:
        """Returns option `name` (underscores read as hyphens), or `default` when it is unset."""
        return self.attrs.get(self.kind.option(name).name, default)

    @property
    def device_type(self) -> str:
        """'cpu' or 'cuda': where code for this target runs."""
        return str(self.kind.get_attr("TDeviceType", "cpu"))

    def export(self) -> dict[str, Any]:
        """Returns the target as a JSON-ready dict that `Target(...)` reads back."""
        out: dict[str, Any] = {"kind": self.kind.name}
        for name, value in self.attrs.items():
            out[name] = list(value) if isinstance(value, tuple) else value
        return out

    # -- the current target ------------------------------------------------------

    @staticmethod
    def current(allow_none: bool = True) -> Target | None:
        """Returns the innermost target of a `with Target(...):` block in this thread."""
        stack = _stack()
        if stack:
            return stack[-1]
        if not allow_none:
            raise TargetError("no target is set: use `with Target(...):` or pass target=")
        return None

    def __enter__(self) -> Target:
        _stack().append(self)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        _stack().pop()

    # -- text ----------------------------------------------------------------------

    def __str__(self) -> str:
        base = {o.name: o.default for o in self.kind.options if o.default is not None}
        head = self.kind.name
        if self.tag is not None:
            base.update(TargetTag.get(self.tag).options)
            head = self.tag
        parts = [head]
        for name, value in self.attrs.items():
            if base.get(name) != value:
                parts.append(f"-{name}={self.kind.option(name).format(value)}")
        return " ".join(parts)

    def backend(self) -> Callable[[Any, Target], Any]:
        """The kind's back end, `(optimized tir.PrimFunc, target) -> runtime module` (its `FBuild`, which
        `kiln.codegen` sets).

        Raises:
            TargetError: for a kind without one.
        """
        build: Callable[[Any, Target], Any] | None = self.kind.get_attr(FBuild)
        if build is None:
            raise TargetError(f"target kind {self.kind.name!r} has no back end (no FBuild attribute): cannot "
                              f"compile for {self}")
        return build

    def summary(self) -> str:
        """The kind and its brief options, for one-line messages: "llvm -mcpu=znver4", "cuda -arch=sm_90"."""
        brief = [f"-{o.name}={o.format(self.attrs[o.name])}" for o in self.kind.options
                 if o.brief and self.attrs.get(o.name) is not None]
        return " ".join([self.kind.name, *brief])

    def __repr__(self) -> str:
        text = str(self)
        if len(text) > 120:
            text = text[:100] + f"... ({len(text)} chars)"
        return f"Target({text!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Target):
            return NotImplemented
        return self.kind is other.kind and dict(self.attrs) == dict(other.attrs)

    def __hash__(self) -> int:
        return hash((self.kind.name, tuple(self.attrs.items())))


def _split(text: str) -> tuple[str, dict[str, str | None]]:
    """Splits "kind -a=1 -b=x -c" into ("kind", {"a": "1", "b": "x", "c": None})."""
    tokens = text.split()
    if not tokens:
        raise TargetError("empty target string; known kinds: " + ", ".join(TargetKind.list_names()))
    head = tokens[0]
    options: dict[str, str | None] = {}
    for token in tokens[1:]:
        if not token.startswith("-") or token == "-" or token.startswith("-="):
            raise TargetError(f"malformed target option {token!r} in {text!r}: options are written -name=value")
        name, eq, value = token[1:].partition("=")
        if eq and not value:
            raise TargetError(f"target option -{name} in {text!r} has no value after '='")
        name = name.replace("_", "-")
        if name in options:
            raise TargetError(f"target option -{name} is given twice in {text!r}")
        options[name] = value if eq else None
    return head, options
