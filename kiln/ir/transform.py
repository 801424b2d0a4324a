"""The pass infrastructure: PassContext, module and function passes, Sequential, instruments.

```python
with PassContext(opt_level=3, disabled_pass=["FoldConstant"], verify=True,
                 instruments=[PassTimingInstrument()]):
    mod = Sequential([InferType(), FoldConstant()])(mod)
```

A pass runs when its opt level is at most the context's, or it is required,
and it is not disabled. With `verify=True` the module is checked before a
`Sequential` and after every pass by that pass's own verifier, which the pass
was built with (`ModulePass(fn, info, verifier=...)`; every Relay pass carries
`relay.transform.verify`: well formed and well typed). A pass without one is
an error under `verify=True`, never silently unchecked; `verify=fn` checks
with `fn` after every pass instead. The IR layer does not know Relay.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, TextIO

import attrs

from kiln.errors import KilnError, did_you_mean
from kiln.ir.module import IRModule


class PassError(KilnError, ValueError):
    """A pass or pass context was misused, or verification failed after a pass."""


@attrs.frozen
class PassInfo:
    """A pass's name, the opt level from which it runs, and the passes it requires."""

    name: str
    opt_level: int = 0
    required: tuple[str, ...] = ()


@attrs.frozen
class ConfigKey:
    """A PassContext config key and the type of its values."""

    name: str
    type: type
    doc: str = ""


_CONFIG_KEYS: dict[str, ConfigKey] = {}
_LOCAL = threading.local()


def register_config(name: str, value_type: type, doc: str = "") -> ConfigKey:
    """Declares a PassContext config key (e.g. "relay.FuseOps.max_depth", int)."""
    key = ConfigKey(name, value_type, doc)
    _CONFIG_KEYS[name] = key
    return key


class PassInstrument:
    """Hooks around passes. Override what you need."""

    def enter_pass_ctx(self) -> None:
        """Called when the PassContext is entered."""

    def exit_pass_ctx(self) -> None:
        """Called when the PassContext is left."""

    def should_run(self, mod: IRModule, info: PassInfo) -> bool:
        """Return False to skip the pass."""
        return True

    def run_before_pass(self, mod: IRModule, info: PassInfo) -> None:
        """Called before each pass that runs."""

    def run_after_pass(self, mod: IRModule, info: PassInfo) -> None:
        """Called after each pass that ran."""


Verifier = Callable[[IRModule], None]  # raises a KilnError for a module that is not valid


class PassContext:
    """The settings passes run under; `with PassContext(...):` makes it current."""

    def __init__(
        self,
        opt_level: int = 2,
        required_pass: Iterable[str] = (),
        disabled_pass: Iterable[str] = (),
        config: Mapping[str, Any] | None = None,
        instruments: Sequence[PassInstrument] = (),
        verify: bool | Verifier = False,
    ) -> None:
        if isinstance(opt_level, bool) or not isinstance(opt_level, int) or not 0 <= opt_level <= 4:
            raise PassError(f"PassContext opt_level must be an int in [0, 4], got {opt_level!r}")
        self.opt_level = opt_level
        self.required_pass = frozenset(required_pass)
        self.disabled_pass = frozenset(disabled_pass)
        self.config = dict(config or {})
        for name, value in self.config.items():
            key = _CONFIG_KEYS.get(name)
            if key is None:
                raise PassError(
                    f"unknown PassContext config key {name!r}{did_you_mean(name, _CONFIG_KEYS)}; "
                    f"known keys: {', '.join(sorted(_CONFIG_KEYS)) or '(none)'}"
                )
            if not isinstance(value, key.type) or (isinstance(value, bool) and key.type is int):
                raise PassError(f"PassContext config {name} expects {key.type.__name__}, got {value!r}")
        self.instruments = list(instruments)
        self.verify = verify

    @staticmethod
    def current() -> PassContext:
        """The innermost PassContext of this thread (a default one outside any)."""
        stack: list[PassContext] = getattr(_LOCAL, "stack", [])
        return stack[-1] if stack else _DEFAULT

    @staticmethod
    def entered() -> bool:
        """Whether this thread is inside a `with PassContext(...):` block."""
        return bool(getattr(_LOCAL, "stack", []))

    def __enter__(self) -> PassContext:
        if not hasattr(_LOCAL, "stack"):
            _LOCAL.stack = []
        _LOCAL.stack.append(self)
        for inst in self.instruments:
            inst.enter_pass_ctx()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        _LOCAL.stack.pop()
        for inst in self.instruments:
            inst.exit_pass_ctx()

    def pass_enabled(self, info: PassInfo) -> bool:
        """Whether a pass with `info` runs in this context."""
        if info.name in self.disabled_pass:
            return False
        return info.name in self.required_pass or info.opt_level <= self.opt_level

    def check(self, mod: IRModule, after: str, verifier: Verifier | None) -> None:
        """With `verify` on, checks `mod` with `verify` itself (a verifier) or the pass's `verifier`.

        Raises:
            PassError: when the module is not valid, or `verify=True` and the pass has no verifier.
        """
        if self.verify is False:
            return
        check = verifier if self.verify is True else self.verify
        if check is None:
            raise PassError(f"PassContext(verify=True) {after}: the pass has no verifier; build it with one "
                            "(ModulePass(..., verifier=relay.transform.verify)) or give PassContext(verify=<verifier>)")
        try:
            check(mod)
        except KilnError as err:
            raise PassError(f"the module is not valid {after}:\n{err}") from err


_DEFAULT = PassContext()


class Pass:
    """A named transformation of a module; call it on a module."""

    info: PassInfo
    verifier: Verifier | None = None  # checks the result under PassContext(verify=True)

    def transform(self, mod: IRModule, ctx: PassContext) -> IRModule:
        """The pass's work (overridden by subclasses)."""
        raise NotImplementedError

    def __call__(self, mod: IRModule) -> IRModule:
        ctx = PassContext.current()
        if not ctx.pass_enabled(self.info):
            return mod
        if not all(inst.should_run(mod, self.info) for inst in ctx.instruments):
            return mod
        for inst in ctx.instruments:
            inst.run_before_pass(mod, self.info)
        for name in self.info.required:
            mod = _REQUIRED_FACTORIES[name]()(mod)
        out = self.transform(mod, ctx)
        if not isinstance(out, IRModule):
            raise PassError(f"pass {self.info.name} returned {type(out).__name__}, not an IRModule")
        for inst in ctx.instruments:
            inst.run_after_pass(out, self.info)
        ctx.check(out, f"after pass {self.info.name}", self.verifier)
        return out

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.info.name} (opt level {self.info.opt_level})>"


# Passes that other passes may require, by name (e.g. "InferType"), as factories.
_REQUIRED_FACTORIES: dict[str, Callable[[], Pass]] = {}


def register_pass_factory(name: str, factory: Callable[[], Pass]) -> None:
    """Lets other passes require the pass `name`."""
    _REQUIRED_FACTORIES[name] = factory


class ModulePass(Pass):
    """A pass given as `fn(mod, ctx) -> mod`."""

    def __init__(self, fn: Callable[[IRModule, PassContext], IRModule], info: PassInfo,
                 verifier: Verifier | None = None) -> None:
        self.fn = fn
        self.info = info
        self.verifier = verifier

    def transform(self, mod: IRModule, ctx: PassContext) -> IRModule:
        return self.fn(mod, ctx)


class FunctionPass(Pass):
    """A pass given as `fn(func, mod, ctx) -> func`, applied to every function of the module."""

    def __init__(self, fn: Callable[[Any, IRModule, PassContext], Any], info: PassInfo,
                 verifier: Verifier | None = None) -> None:
        self.fn = fn
        self.info = info
        self.verifier = verifier

    def transform(self, mod: IRModule, ctx: PassContext) -> IRModule:
        out = mod.copy()
        for gvar, func in mod.items():
            out[gvar] = self.fn(func, mod, ctx)
        return out


class Sequential(Pass):
    """Runs passes in order; its own opt level gates the whole sequence."""

    def __init__(self, passes: Sequence[Pass], opt_level: int = 0, name: str = "Sequential",
                 verifier: Verifier | None = None) -> None:
        self.passes = list(passes)
        self.info = PassInfo(name, opt_level)
        self.verifier = verifier or next((p.verifier for p in self.passes if p.verifier is not None), None)

    def transform(self, mod: IRModule, ctx: PassContext) -> IRModule:
        ctx.check(mod, f"before {self.info.name}", self.verifier)
        for p in self.passes:
            mod = p(mod)
        return mod


ModuleFn = Callable[[IRModule, PassContext], IRModule]


def module_pass(opt_level: int = 0, name: str | None = None, required: Sequence[str] = (),
                verifier: Verifier | None = None) -> Callable[[ModuleFn], ModulePass]:
    """Decorator: turns `fn(mod, ctx) -> mod` into a ModulePass."""

    def wrap(fn: Callable[[IRModule, PassContext], IRModule]) -> ModulePass:
        return ModulePass(fn, PassInfo(name or fn.__name__, opt_level, tuple(required)), verifier)

    return wrap


def function_pass(opt_level: int = 0, name: str | None = None, required: Sequence[str] = (),
                  verifier: Verifier | None = None) -> Callable[[Callable[[Any, IRModule, PassContext], Any]],
                                                                FunctionPass]:
    """Decorator: turns `fn(func, mod, ctx) -> func` into a FunctionPass."""

    def wrap(fn: Callable[[Any, IRModule, PassContext], Any]) -> FunctionPass:
        return FunctionPass(fn, PassInfo(name or fn.__name__, opt_level, tuple(required)), verifier)

    return wrap


# ---------------------------------------------------------------------------
# Instruments
# ---------------------------------------------------------------------------


class PassTimingInstrument(PassInstrument):
    """Measures the wall time of every pass; `render()` lists them."""

    def __init__(self) -> None:
        self.timings: list[tuple[str, float]] = []
        self._started: list[float] = []

    def run_before_pass(self, mod: IRModule, info: PassInfo) -> None:
        self._started.append(time.perf_counter())

    def run_after_pass(self, mod: IRModule, info: PassInfo) -> None:
        self.timings.append((info.name, time.perf_counter() - self._started.pop()))

    def render(self) -> str:
        """One line per pass run: name and milliseconds."""
        return "\n".join(f"{name:32} {seconds * 1e3:9.3f} ms" for name, seconds in self.timings)


class PrintIRInstrument(PassInstrument):
    """Dumps the module after every pass (to a stream, or one file per pass in a folder)."""

    def __init__(self, stream: TextIO | None = None, folder: str | None = None) -> None:
        self.stream = stream
        self.folder = folder
        self.count = 0

    def run_after_pass(self, mod: IRModule, info: PassInfo) -> None:
        text = mod.astext()
        self.count += 1
        if self.folder is not None:
            import os

            os.makedirs(self.folder, exist_ok=True)
            with open(os.path.join(self.folder, f"{self.count:03d}_{info.name}.txt"), "w") as f:
                f.write(text)
        if self.stream is not None:
            self.stream.write(f"// IR after {info.name}\n{text}\n")
