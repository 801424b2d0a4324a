"""One op, one place: every op of the library is declared, computed, scheduled and constructed in one module.

The registry records where each attribute was set (its site); each op's
definition, every attribute (relation, pattern, reference, compute, schedules,
implementations) and its Python constructor must come from the same file, and
each constructor's parameters are the op's arguments and attrs fields
(`@constructor` checks that at import).
"""

from __future__ import annotations

import inspect
import types
from pathlib import Path

import attrs
import pytest

from kiln import relay
from kiln.errors import RegistryError
from kiln.registry import Op, OpPattern, attr, op_registry, register_op
from kiln.relay.op import constructor

ROOT = Path(__file__).resolve().parents[3]


def _file(site: object) -> str:
    return str(site).rsplit(":", 1)[0]


def _constructors() -> dict[str, list[types.FunctionType]]:
    """Every function marked @constructor in the relay namespaces users call (relay.x, relay.nn.x, ...)."""
    found: dict[str, list[types.FunctionType]] = {}
    for space in (relay, relay.nn, relay.image, relay.qnn):
        for value in vars(space).values():
            name = getattr(value, "__kiln_op__", None)
            if name is not None and value not in found.setdefault(name, []):
                found[name].append(value)
    return found


def test_every_op_is_declared_computed_and_constructed_in_one_module() -> None:
    registry = op_registry()
    constructors = _constructors()
    spread = []
    for op in registry.list_keys():
        sites = {"defined": _file(registry.created_at(op))}
        sites.update({key: _file(slot.site) for key, slot in registry.attrs_of(op).items()})
        sites.update({f"constructor {fn.__name__}": str(Path(inspect.getfile(fn)).relative_to(ROOT))
                      for fn in constructors.get(op.name, [])})
        if len(set(sites.values())) > 1:
            spread.append(f"{op.name}: {sites}")
    assert not spread, "ops declared in more than one module:\n" + "\n".join(spread)


def test_every_op_has_a_relation_pattern_reference_compute_and_constructor() -> None:
    constructors = _constructors()
    missing = []
    for op in op_registry().list_keys():
        for key in (attr.FTypeRelation, attr.TOpPattern, attr.FReference, attr.FCompute):
            if not op.has_attr(key):
                missing.append(f"{op.name}: no {key.name}")
        if op.name not in constructors:
            missing.append(f"{op.name}: no @constructor in relay, relay.nn, relay.image or relay.qnn")
    assert not missing, "\n".join(missing)


def test_a_constructor_that_disagrees_with_its_declaration_is_refused() -> None:
    @attrs.frozen
    class FactorAttrs:
        factor: float = 1.0

    (register_op("test.decl").describe("x * factor").add_argument("data", "Tensor", "the input")
     .set_attrs_type(FactorAttrs).set_attr(attr.TOpPattern, OpPattern.ELEMWISE))

    @constructor("test.decl")
    def fine(data: relay.Expr, factor: float = 1.0) -> relay.Call:
        return relay.call("test.decl", [data], FactorAttrs(factor))

    assert fine.__kiln_op__ == "test.decl"  # type: ignore[attr-defined]
    with pytest.raises(RegistryError, match=r"constructor .*wrong of op test.decl: its parameters \['x', 'factor'\] "
                                            r"must be the op's arguments \['data'\], in order, and fields of "
                                            r"FactorAttrs \['factor'\]; neither: \['x'\]"):
        @constructor("test.decl")
        def wrong(x: relay.Expr, factor: float = 1.0) -> relay.Call:
            raise AssertionError("never called")
    with pytest.raises(RegistryError, match=r"neither: \['scale'\]"):
        @constructor("test.decl")
        def typo(data: relay.Expr, scale: float = 1.0) -> relay.Call:
            raise AssertionError("never called")
    assert Op.get("test.decl").num_inputs == 1
