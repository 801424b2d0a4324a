"""`IRModule`: the global functions of a program, by name.

The IR layer does not know Relay: functions are stored as given, and what a
module needs of them comes from their own class: `make_global_var(name)` names
one added by name, `print_module(mod)` prints a module of them (Relay's
`Function` has both).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from kiln.errors import KilnError, did_you_mean


class ModuleError(KilnError, LookupError):
    """A module lookup named no function."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class IRModule:
    """Global functions by GlobalVar; `mod["main"]` looks one up by name."""

    def __init__(self, functions: Mapping[Any, Any] | None = None) -> None:
        self._functions: dict[str, tuple[Any, Any]] = {}
        for key, func in (functions or {}).items():
            self[key] = func

    @staticmethod
    def from_expr(func: Any) -> IRModule:
        """A module whose "main" is `func`."""
        return IRModule({"main": func})

    def _name(self, key: Any) -> str:
        return key if isinstance(key, str) else str(key.name_hint)

    def get_global_var(self, name: str) -> Any:
        """The GlobalVar named `name`."""
        if name not in self._functions:
            raise ModuleError(f"module has no function {name!r}{did_you_mean(name, self._functions)}")
        return self._functions[name][0]

    def __setitem__(self, key: Any, func: Any) -> None:
        name = self._name(key)
        if isinstance(key, str):
            existing = self._functions.get(name)
            if existing is not None:
                gvar = existing[0]
            else:
                make: Callable[[str], Any] | None = getattr(type(func), "make_global_var", None)
                if make is None:
                    raise ModuleError(f"a {type(func).__name__} cannot be added by name: its class has no "
                                      "make_global_var; give the module a global var as the key")
                gvar = make(name)
        else:
            gvar = key
        self._functions[name] = (gvar, func)

    def __getitem__(self, key: Any) -> Any:
        name = self._name(key)
        if name not in self._functions:
            raise ModuleError(f"module has no function {name!r}{did_you_mean(name, self._functions)}")
        return self._functions[name][1]

    def __contains__(self, key: Any) -> bool:
        return self._name(key) in self._functions

    def __iter__(self) -> Iterator[str]:
        return iter(self._functions)

    def __len__(self) -> int:
        return len(self._functions)

    @property
    def global_vars(self) -> list[Any]:
        """The GlobalVars, in insertion order."""
        return [g for g, _ in self._functions.values()]

    def items(self) -> list[tuple[Any, Any]]:
        """(GlobalVar, function) pairs, in insertion order."""
        return list(self._functions.values())

    def copy(self) -> IRModule:
        """A new module with the same functions."""
        new = IRModule()
        new._functions = dict(self._functions)
        return new

    def astext(self) -> str:
        """The module in its functions' text format (kiln's Relay text for Relay functions)."""
        printers = {getattr(type(f), "print_module", None) for _, f in self._functions.values()}
        if not printers:
            return ""
        if len(printers) != 1 or None in printers:
            return repr(self)
        (printer,) = printers
        assert printer is not None
        return str(printer(self))

    def __str__(self) -> str:
        return self.astext()

    def __repr__(self) -> str:
        return f"IRModule({', '.join(self._functions)})"
