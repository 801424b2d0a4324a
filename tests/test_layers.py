"""kiln's layers point one way: every import of kiln/ is walked and checked against the package order.

registry and ir at the bottom; target; tir and te; runtime (loadable without the
compiler); relay; codegen; the top-level modules (kiln.build, the command line,
the demo) and kiln.testing over them all. No package imports one above it, no
two packages (or subpackages) import each other, and only kiln.target compares
target-kind names: the others read a kind's attributes (`FBuild`, `TDeviceType`).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

KILN = Path(__file__).resolve().parent.parent / "kiln"

# What each package may import (besides itself and the leaf modules, which import nothing of kiln).
ALLOWED: dict[str, set[str]] = {
    "registry": set(),
    "ir": {"registry"},
    "target": {"registry", "ir"},
    "tir": {"ir"},
    "te": {"ir", "tir"},
    "runtime": {"registry", "ir", "target", "tir"},
    "relay": {"registry", "ir", "target", "tir", "te", "runtime"},
    "codegen": {"registry", "ir", "target", "tir", "runtime"},
}
LEAVES = {"kiln.errors", "kiln.log", "kiln.version"}
MAX_LINES = 800


def _module_name(path: Path) -> str:
    parts = path.relative_to(KILN.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> list[tuple[Path, int, str]]:
    """(file, line, imported module or module.name) for every import of kiln code, function-level ones too."""
    found = []
    for path in sorted(KILN.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found += [(path, node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "kiln"]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and \
                    node.module.split(".")[0] == "kiln":
                found += [(path, node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return found


def _resolve(name: str) -> str:
    """The kiln module or package that an imported name lives in (`kiln.relay.expr.Call` -> kiln.relay.expr)."""
    parts = name.split(".")
    while len(parts) > 1:
        path = KILN.parent.joinpath(*parts)
        if path.is_dir() or path.with_suffix(".py").exists():
            return ".".join(parts)
        parts.pop()
    return "kiln"


def _package(module: str) -> str:
    """The package of a kiln module: "relay" for kiln.relay.op.nn, "(top)" for kiln.build."""
    parts = module.split(".")
    if len(parts) >= 2 and (KILN / parts[1]).is_dir():
        return parts[1]
    return "leaf" if module in LEAVES else "(top)"


def _node(module: str) -> str:
    """The unit of the cycle check: a package or subpackage (its folder), or a top-level module."""
    path = KILN.parent.joinpath(*module.split("."))
    if path.is_dir() or len(module.split(".")) <= 2:
        return module
    return module.rsplit(".", 1)[0]


def test_no_package_imports_one_above_it() -> None:
    bad = []
    for path, line, name in _imports():
        source, target = _package(_module_name(path)), _package(_resolve(name))
        if source in ("(top)", "testing") or target in (source, "leaf"):
            continue
        if source == "leaf" or target not in ALLOWED.get(source, set()):
            bad.append(f"{path.relative_to(KILN.parent)}:{line}: {source} imports {target} ({name})")
    assert not bad, "upward imports:\n" + "\n".join(bad)


def test_no_two_packages_import_each_other() -> None:
    # a package's __init__ re-exports its subpackages: it is a facade, not a user of them
    graph: dict[str, set[str]] = defaultdict(set)
    where: dict[tuple[str, str], str] = {}
    for path, line, name in _imports():
        if path.name == "__init__.py":
            continue
        source, target = _node(_module_name(path)), _node(_resolve(name))
        if source != target:
            graph[source].add(target)
            where.setdefault((source, target), f"{path.relative_to(KILN.parent)}:{line}")
    cycles = []
    for a in sorted(graph):
        for b in sorted(graph[a]):
            if a < b and a in _reachable(graph, b):
                cycles.append(f"{a} -> {b} ({where[(a, b)]}) and back: {_path(graph, b, a, where)}")
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, stack = {start}, [start]
    while stack:
        for nxt in graph.get(stack.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return seen


def _path(graph: dict[str, set[str]], start: str, goal: str, where: dict[tuple[str, str], str]) -> str:
    parent: dict[str, str] = {start: start}
    stack = [start]
    while stack:
        cur = stack.pop(0)
        for nxt in sorted(graph.get(cur, ())):
            if nxt not in parent:
                parent[nxt] = cur
                stack.append(nxt)
    steps, cur = [], goal
    while cur != start:
        steps.append(f"{parent[cur]} -> {cur} ({where[(parent[cur], cur)]})")
        cur = parent[cur]
    return "; ".join(reversed(steps))


def _is_kind_name(node: ast.AST) -> bool:
    """`<anything>.kind.name`: a target kind's name."""
    return isinstance(node, ast.Attribute) and node.attr == "name" and isinstance(node.value, ast.Attribute) \
        and node.value.attr == "kind"


def test_only_the_target_package_compares_target_kind_names() -> None:
    bad = []
    for path in sorted(KILN.rglob("*.py")):
        if path.is_relative_to(KILN / "target"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Compare) and any(_is_kind_name(n) for n in [node.left, *node.comparators]):
                bad.append(f"{path.relative_to(KILN.parent)}:{node.lineno}: {ast.unparse(node)}")
    assert not bad, "dispatch on target kind names (read an attribute of the kind instead):\n" + "\n".join(bad)


def test_the_checks_see_what_they_look_for() -> None:
    # the walkers themselves: an upward import, a kind-name comparison
    tree = ast.parse("from kiln.relay.printer import astext\nif t.kind.name == 'cuda': pass\n")
    imports = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert _package(_resolve(f"{imports[0].module}.astext")) == "relay"
    assert "relay" not in ALLOWED["ir"]
    assert any(isinstance(n, ast.Compare) and _is_kind_name(n.left) for n in ast.walk(tree))
    assert _node("kiln.relay.transform.fuse_ops") == "kiln.relay.transform" and _node("kiln.build") == "kiln.build"


def test_modules_stay_under_800_lines() -> None:
    long = [f"{p.relative_to(KILN.parent)}: {n} lines" for p in sorted(KILN.rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > MAX_LINES]
    assert not long, "split these by family:\n" + "\n".join(long)
