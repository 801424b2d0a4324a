"""The one walk over a graph of nodes: Relay expressions, te operations, loop IR, ONNX nodes.

`post_order(roots, children)` lists every node reachable from `roots` once,
after all of its children, with an explicit stack: a 10,000-deep chain is no
deeper for it than a flat list, and a node shared by many parents (a diamond
repeated 30 times) is walked once, not once per path. Every IR walks with it;
each says what a node's children are.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from typing import TypeVar

N = TypeVar("N")


def post_order(
    roots: Iterable[N],
    children: Callable[[N], Iterable[N]],
    key: Callable[[N], Hashable] = id,
    on_cycle: Callable[[N], Exception] | None = None,
) -> list[N]:
    """Every node reachable from `roots`, each once, children before parents (in their order).

    Args:
        roots: where to start, in order.
        children: a node's children (the nodes it reads), in order.
        key: what makes two nodes the same node (identity by default; an index for numbered nodes).
        on_cycle: called with a node reached again while its own children are being walked; its
            result is raised. Without it, graphs are taken to be acyclic (as IR nodes are).

    Returns:
        The nodes in post order.
    """
    out: list[N] = []
    state: dict[Hashable, bool] = {}  # False: its children are being walked; True: done
    stack: list[tuple[N, bool]] = [(r, False) for r in reversed(list(roots))]
    while stack:
        node, expanded = stack.pop()
        k = key(node)
        if expanded:
            state[k] = True
            out.append(node)
            continue
        if k in state:
            continue
        state[k] = False
        stack.append((node, True))
        for child in reversed(list(children(node))):
            done = state.get(key(child))
            if done is None:
                stack.append((child, False))
            elif not done and on_cycle is not None:
                raise on_cycle(child)
    return out
