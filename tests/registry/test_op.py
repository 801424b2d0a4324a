"""The op registry: interning, set_attr chains, plevels, validation, attribute maps."""

from __future__ import annotations

import inspect
import pickle
import re

import attrs
import pytest

from kiln import registry
from kiln.errors import AttrValueError, DuplicateAttrError, RegistryError, UnknownNameError
from kiln.registry import AttrRegistry, Op, OpPattern, OpRegEntry, attr, register_op


@attrs.frozen
class ScaleAttrs:
    factor: float = attrs.field(default=1.0, metadata={"doc": "multiplier"})


def _line() -> int:
    """The line number of the caller's next line."""
    frame = inspect.currentframe()
    assert frame is not None and frame.f_back is not None
    return frame.f_back.f_lineno + 1


def _full_op(name: str = "test.scale") -> OpRegEntry:
    return (
        register_op(name)
        .describe("x * factor")
        .set_num_inputs(1)
        .add_argument("data", "Tensor", "input")
        .set_attrs_type(ScaleAttrs)
        .add_type_rel("Identity", lambda types, attrs: types[0])
        .set_support_level(2)
        .set_attr(attr.TOpPattern, OpPattern.ELEMWISE)
    )


def test_op_get_returns_the_same_interned_object() -> None:
    _full_op()
    assert Op.get("test.scale") is Op.get("test.scale")
    assert registry.op_registry().register_or_get("test.scale").key is Op.get("test.scale")


def test_register_or_get_keeps_the_registration_index() -> None:
    a = register_op("test.first").key
    b = register_op("test.second").key
    assert b.index == a.index + 1
    assert registry.op_registry().register_or_get("test.first").key.index == a.index
    assert Op.list_names()[-2:] == ["test.first", "test.second"]


def test_chain_records_metadata_and_attributes() -> None:
    _full_op()
    op = Op.get("test.scale")
    assert op.description == "x * factor"
    assert op.num_inputs == 1
    assert [a.name for a in op.arguments] == ["data"]
    assert op.arguments[0].type_info == "Tensor"
    assert op.attrs_type is ScaleAttrs
    assert op.support_level == 2
    assert op.get_attr(attr.TOpPattern) is OpPattern.ELEMWISE
    relation = op.get_attr(attr.FTypeRelation)
    assert relation is not None and relation.name == "Identity"
    assert relation(["t"], None) == "t"


def test_generic_registry_is_one_per_entry_type() -> None:
    reg = AttrRegistry.global_(OpRegEntry)
    assert reg is registry.op_registry()
    assert reg.kind == "op"
    with pytest.raises(UnknownNameError, match="no registry holds entries of type int"):
        AttrRegistry.global_(int)  # type: ignore[type-var]  # the point: not an entry type


def test_attr_map_supports_lookup_membership_len_and_iteration() -> None:
    pattern = Op.get_attr_map(attr.TOpPattern)
    built_in = len(pattern)  # the op library's ops
    _full_op("test.a")
    _full_op("test.b")
    register_op("test.c").describe("no pattern")
    a, b, c = Op.get("test.a"), Op.get("test.b"), Op.get("test.c")
    assert pattern[a] is OpPattern.ELEMWISE
    assert pattern.get(c) is None
    assert pattern.get(c, OpPattern.OPAQUE) is OpPattern.OPAQUE
    assert a in pattern and b in pattern and c not in pattern
    assert "test.a" not in pattern  # names are not keys
    assert len(pattern) == built_in + 2
    assert list(pattern)[-2:] == [a, b]
    assert pattern.items()[-2:] == [(a, OpPattern.ELEMWISE), (b, OpPattern.ELEMWISE)]
    assert len(list(pattern)) == len(pattern.items()) == len(pattern)
    with pytest.raises(UnknownNameError, match="op test.c has no attribute TOpPattern"):
        pattern[c]


def test_attr_map_is_live() -> None:
    pattern = Op.get_attr_map(attr.TOpPattern)
    before = len(pattern)
    _full_op()
    assert len(pattern) == before + 1


def test_has_attr_answers_for_this_op_only() -> None:
    _full_op("test.a")
    register_op("test.b").describe("b")
    assert Op.get("test.a").has_attr(attr.TOpPattern)
    assert not Op.get("test.b").has_attr(attr.TOpPattern)


def test_higher_plevel_overrides_and_lower_plevel_is_ignored() -> None:
    _full_op()
    op = Op.get("test.scale")
    op.set_attr(attr.TOpPattern, OpPattern.OPAQUE, plevel=11)
    assert op.get_attr(attr.TOpPattern) is OpPattern.OPAQUE
    op.set_attr(attr.TOpPattern, OpPattern.INJECTIVE, plevel=5)
    assert op.get_attr(attr.TOpPattern) is OpPattern.OPAQUE
    slot = registry.op_registry().slot(attr.TOpPattern, op)
    assert slot is not None and slot.plevel == 11


def test_same_plevel_twice_names_both_sites() -> None:
    entry = register_op("test.dup")
    first = _line()
    entry.set_attr(attr.TOpPattern, OpPattern.ELEMWISE)
    second = _line()
    with pytest.raises(DuplicateAttrError) as info:
        entry.set_attr(attr.TOpPattern, OpPattern.OPAQUE)
    message = str(info.value)
    assert f"test_op.py:{first}" in message
    assert f"test_op.py:{second + 1}" in message
    assert "TOpPattern" in message and "test.dup" in message and "plevel 10" in message
    assert Op.get("test.dup").get_attr(attr.TOpPattern) is OpPattern.ELEMWISE


def test_reset_attr_removes_the_attribute_whatever_its_plevel() -> None:
    _full_op()
    op = Op.get("test.scale")
    op.set_attr(attr.TOpPattern, OpPattern.OPAQUE, plevel=50).reset_attr(attr.TOpPattern)
    assert not op.has_attr(attr.TOpPattern)
    op.set_attr(attr.TOpPattern, OpPattern.BROADCAST, plevel=1)
    assert op.get_attr(attr.TOpPattern) is OpPattern.BROADCAST


@pytest.mark.parametrize(
    ("key", "value", "expects"),
    [
        (attr.TOpPattern, 0, "an OpPattern"),
        (attr.TOpPattern, "ELEMWISE", "an OpPattern"),
        (attr.FCompute, 42, "a callable"),
        (attr.FReference, None, "a callable"),
        (attr.TOpIsStateful, 1, "a bool"),
        (attr.FTypeRelation, lambda t, a: t, "a TypeRelation"),
    ],
)
def test_a_value_of_the_wrong_kind_is_refused(key: registry.AttrKey[object], value: object, expects: str) -> None:
    entry = register_op("test.kind")
    with pytest.raises(AttrValueError, match=f"attribute {key.name} of op test.kind expects {expects}"):
        entry.set_attr(key, value)
    assert not Op.get("test.kind").has_attr(key)


def test_bad_plevel_is_refused() -> None:
    with pytest.raises(AttrValueError, match="plevel .* must be an int >= 0"):
        register_op("test.p").set_attr(attr.TOpPattern, OpPattern.ELEMWISE, plevel=-1)


def test_string_keys_resolve_and_typos_name_the_closest_key() -> None:
    register_op("test.s").set_attr("TOpPattern", OpPattern.ELEMWISE)
    assert Op.get("test.s").get_attr("TOpPattern") is OpPattern.ELEMWISE
    with pytest.raises(UnknownNameError, match=r"unknown op attribute key 'TOpPatern' \(did you mean 'TOpPattern'"):
        Op.get("test.s").set_attr("TOpPatern", OpPattern.ELEMWISE)
    with pytest.raises(UnknownNameError, match="FComptue"):
        Op.get_attr_map("FComptue")


def test_declared_keys_work_like_built_in_ones() -> None:
    key = registry.declare_attr_key("TMyCost", "an int", registry.instance_of(int), "cost model")
    register_op("test.cost").set_attr("TMyCost", 3)
    assert Op.get("test.cost").get_attr(key) == 3
    with pytest.raises(AttrValueError, match="TMyCost of op test.cost expects an int"):
        Op.get("test.cost").set_attr(key, True, plevel=20)


def test_keys_of_another_registry_are_refused() -> None:
    from kiln.target import FTargetParser

    with pytest.raises(UnknownNameError, match="unknown op attribute key 'FTargetParser'"):
        register_op("test.wrongkey").set_attr(FTargetParser, lambda opts: opts)
    undeclared = registry.AttrKey("TOpPattern", "an int", registry.instance_of(int))  # same name, another key
    with pytest.raises(UnknownNameError, match="unknown op attribute key 'TOpPattern'"):
        Op.get("test.wrongkey").set_attr(undeclared, 1)


def test_all_issue_keys_exist_as_constants() -> None:
    names = {k.name for k in registry.op_registry().list_attr_keys()}
    required = {"TOpPattern", "FTypeRelation", "FCompute", "FSchedule", "FStrategy", "FPrimalGradient",
                "TOpIsStateful", "FReference"}
    assert required <= names
    for name in required:
        assert getattr(attr, name).name == name


def test_unknown_op_lists_the_closest_names() -> None:
    _full_op("tst.conv2d")
    _full_op("tst.conv1d")
    with pytest.raises(UnknownNameError, match=r"unknown op 'tst.conv2' \(did you mean 'tst.conv2d', 'tst.conv1d'"):
        Op.get("tst.conv2")
    with pytest.raises(LookupError):  # kiln's errors are also the builtins that describe them
        Op.get("zzz")


@pytest.mark.parametrize("name", ["add", "nn.conv2d", "dyn.nn.pad", "qnn.conv2d_transpose", "a1"])
def test_valid_op_names(name: str) -> None:
    assert registry.op_registry().register_or_get(name).name == name


@pytest.mark.parametrize("name", ["", "Add", "nn.Conv2d", "nn..conv", ".add", "add.", "1add", "nn-conv", "a b", 3])
def test_invalid_op_names_are_refused(name: object) -> None:
    with pytest.raises(RegistryError, match="invalid op name"):
        register_op(name)  # type: ignore[arg-type]  # the point: bad names


def test_argument_names_are_unique() -> None:
    entry = register_op("test.args").add_argument("x", "Tensor")
    with pytest.raises(RegistryError, match="argument 'x' is declared twice"):
        entry.add_argument("x", "Tensor")
    with pytest.raises(RegistryError, match="argument name must be an identifier"):
        entry.add_argument("not valid", "Tensor")


def test_num_inputs_and_arguments_must_agree_in_either_order() -> None:
    # set_num_inputs first, then the arguments: fine once complete
    register_op("test.order1").set_num_inputs(2).add_argument("a", "Tensor").add_argument("b", "Tensor")
    Op.get("test.order1").verify()
    # arguments first, then set_num_inputs
    register_op("test.order2").add_argument("a", "Tensor").add_argument("b", "Tensor").set_num_inputs(2)
    Op.get("test.order2").verify()
    # too many arguments for the declared inputs, either way round
    with pytest.raises(RegistryError, match="would be input 2, but the op declares 1 inputs"):
        register_op("test.bad1").set_num_inputs(1).add_argument("a", "Tensor").add_argument("b", "Tensor")
    with pytest.raises(RegistryError, match=r"set_num_inputs\(1\) but 2 arguments are declared: a, b"):
        register_op("test.bad2").add_argument("a", "Tensor").add_argument("b", "Tensor").set_num_inputs(1)
    # too few arguments shows when the op is verified
    register_op("test.bad3").set_num_inputs(3).add_argument("a", "Tensor")
    with pytest.raises(RegistryError, match="declares 3 inputs .* but has 1 arguments: a"):
        Op.get("test.bad3").verify()


def test_type_relation_order_does_not_matter() -> None:
    register_op("test.rel1").add_type_rel("R", lambda t, a: t[0]).add_argument("x", "Tensor").set_num_inputs(1)
    register_op("test.rel2").set_num_inputs(1).add_argument("x", "Tensor").add_type_rel("R", lambda t, a: t[0])
    for name in ("test.rel1", "test.rel2"):
        op = Op.get(name)
        op.verify()
        assert op.num_inputs == 1 and op.get_attr(attr.FTypeRelation) is not None


def test_metadata_cannot_be_silently_changed() -> None:
    entry = register_op("test.meta").describe("one thing")
    entry.describe("one thing")  # the same value again is fine
    with pytest.raises(RegistryError, match="description is set to 'one thing' at .*test_op.py"):
        entry.describe("another thing")
    with pytest.raises(RegistryError, match="set_attrs_type expects an attrs class"):
        entry.set_attrs_type(dict)
    with pytest.raises(RegistryError, match=r"support level must be an int in \[0, 10\]"):
        entry.set_support_level(11)


def test_a_user_overrides_an_attribute_registered_elsewhere() -> None:
    # The "library" registers at the default plevel from its module ...
    _full_op("lib.relu")
    op = Op.get("lib.relu")
    site = registry.op_registry().slot(attr.TOpPattern, op)
    assert site is not None and "test_op.py" in str(site.site)
    # ... and a user replaces its compute from Python at a higher plevel.
    op.set_attr(attr.FCompute, lambda *a: "mine", plevel=20)
    op.set_attr(attr.TOpPattern, OpPattern.OPAQUE, plevel=20)
    assert op.get_attr(attr.FCompute)() == "mine"  # type: ignore[misc]  # FCompute is a callable
    assert Op.get_attr_map(attr.TOpPattern)[op] is OpPattern.OPAQUE


def test_registration_helpers_report_their_callers_line() -> None:
    # Frames inside RegEntry methods are skipped, so the site is this file, not op.py.
    line = _line()
    entry = register_op("test.site").set_attr(attr.TOpPattern, OpPattern.ELEMWISE)
    slot = registry.op_registry().slot(attr.TOpPattern, Op.get("test.site"))
    assert slot is not None and str(slot.site).endswith(f"test_op.py:{line}")
    line = _line()
    entry.describe("where")
    assert re.fullmatch(rf".*test_op\.py:{line}", str(Op.get("test.site").meta.site_of("description")))


def test_ops_pickle_by_name() -> None:
    _full_op()
    op = Op.get("test.scale")
    assert pickle.loads(pickle.dumps(op)) is op


# --- a second definition, families of keys, resets of one plevel -----------------------------


def test_a_second_definition_of_an_op_names_both_sites() -> None:
    first = _line()
    register_op("test.twice").describe("once")
    second = _line()
    with pytest.raises(registry.OpAlreadyExistsError) as info:
        register_op("test.twice")
    message = str(info.value)
    assert f"op 'test.twice' is defined twice: first at tests/registry/test_op.py:{first}" in message
    assert f"again at tests/registry/test_op.py:{second + 1}" in message
    assert "use Op.get('test.twice').set_attr(...)" in message
    with pytest.raises(registry.OpAlreadyExistsError, match=r"op 'nn.relu' is defined twice: first at "
                                                             r"kiln/relay/op/nn.py:\d+"):
        register_op("nn.relu")
    Op.get("test.twice").set_attr(attr.FReference, lambda attrs, x: x)  # adding attributes is fine
    assert registry.op_registry().register_or_get("test.twice").key is Op.get("test.twice")


def test_keyed_attributes_resolve_by_key_and_by_string() -> None:
    op = _full_op().key
    cuda = attr.FSchedule["cuda"]
    assert cuda.name == "FSchedule[cuda]" and cuda.qualifier == "cuda" and cuda.base is attr.FSchedule
    op.set_attr(cuda, _schedule_a)
    op.set_attr("FSchedule[llvm]", _schedule_b)
    op.set_attr(attr.FSchedule, _schedule_b)
    assert op.get_attr(attr.FSchedule["cuda"]) is _schedule_a and op.get_attr("FSchedule[cuda]") is _schedule_a
    slots = registry.op_registry().family_slots(attr.FSchedule, op)
    assert list(slots) == ["cuda", "llvm"] and slots["llvm"].value is _schedule_b
    with pytest.raises(AttrValueError, match=r"attribute key TOpPattern takes no qualifier"):
        attr.TOpPattern["cuda"]
    with pytest.raises(AttrValueError, match=r"FSchedule is qualified by a target kind name: .* got 'a b'"):
        attr.FSchedule["a b"]
    with pytest.raises(UnknownNameError, match=r"unknown op attribute key 'FShedule'"):
        op.set_attr("FShedule[cuda]", _schedule_a)


def _schedule_a(*args: object) -> None:
    """A stand-in schedule."""


def _schedule_b(*args: object) -> None:
    """Another stand-in schedule."""


def test_resetting_one_plevel_shows_the_value_it_hid() -> None:
    op = _full_op().key  # TOpPattern ELEMWISE at plevel 10
    op.set_attr(attr.TOpPattern, OpPattern.OPAQUE, plevel=20)
    op.set_attr(attr.TOpPattern, OpPattern.BROADCAST, plevel=5)  # hidden under both
    with pytest.raises(DuplicateAttrError, match="set twice at plevel 5"):
        op.set_attr(attr.TOpPattern, OpPattern.INJECTIVE, plevel=5)
    assert op.get_attr(attr.TOpPattern) is OpPattern.OPAQUE
    op.reset_attr(attr.TOpPattern, plevel=20)
    assert op.get_attr(attr.TOpPattern) is OpPattern.ELEMWISE
    op.reset_attr(attr.TOpPattern, plevel=10)
    assert op.get_attr(attr.TOpPattern) is OpPattern.BROADCAST
    op.set_attr(attr.TOpPattern, OpPattern.OPAQUE, plevel=20)
    op.reset_attr(attr.TOpPattern)  # every plevel
    assert not op.has_attr(attr.TOpPattern)
