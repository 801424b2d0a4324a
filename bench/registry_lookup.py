"""How much an attribute lookup costs: passes ask `OpAttrMap[op]` once per call node.

Prints nanoseconds per lookup for kiln's registry beside a plain dict holding
the same values, measured in the same run, and the ratio.
"""

from __future__ import annotations

import statistics
import timeit

from kiln import registry
from kiln.registry import Op, OpPattern, attr

N_OPS = 200
REPEAT, NUMBER = 7, 20_000


def median_ns(stmt: str, env: dict[str, object]) -> float:
    times = timeit.repeat(stmt, globals=env, repeat=REPEAT, number=NUMBER)
    return statistics.median(times) / NUMBER * 1e9


def main() -> None:
    with registry.scope():
        for i in range(N_OPS):
            registry.register_op(f"bench.op{i}").set_attr(attr.TOpPattern, OpPattern.ELEMWISE)
        op = Op.get(f"bench.op{N_OPS // 2}")
        pattern = Op.get_attr_map(attr.TOpPattern)
        plain = {Op.get(f"bench.op{i}"): OpPattern.ELEMWISE for i in range(N_OPS)}
        env = {"op": op, "pattern": pattern, "plain": plain, "Op": Op, "attr": attr}
        base = median_ns("plain[op]", env)
        rows = [
            ("dict[op] (baseline)", base),
            ("OpAttrMap[op]", median_ns("pattern[op]", env)),
            ("OpAttrMap.get(op)", median_ns("pattern.get(op)", env)),
            ("op in OpAttrMap", median_ns("op in pattern", env)),
            ("op.get_attr(TOpPattern)", median_ns("op.get_attr(attr.TOpPattern)", env)),
            ("Op.get(name)", median_ns("Op.get('bench.op100')", env)),
        ]
    print(f"{'lookup':28} {'ns':>8} {'x dict':>8}")
    for name, ns in rows:
        print(f"{name:28} {ns:8.0f} {ns / base:8.1f}")


if __name__ == "__main__":
    main()
