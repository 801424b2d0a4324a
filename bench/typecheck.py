"""Type inference speed: a 10,000-call chain and a 1,000-node ResNet-like graph.

Prints the time to build and to type-check each, and the time per node. The
issue's bar: type inference of the 10,000-call chain in under 2 seconds.
"""

from __future__ import annotations

import functools

import numpy as np
from timing import median_time

from kiln import relay
from kiln.relay.visitor import post_order


def chain(n: int = 10_000) -> relay.Function:
    """x -> add -> tanh -> add -> ... (n calls)."""
    x = relay.var("x", shape=("n", 64))
    y: relay.Expr = x
    for i in range(n):
        y = relay.tanh(y) if i % 2 else relay.add(y, x)
    return relay.Function([x], y)


def resnet_like(target_nodes: int = 1_000) -> relay.Function:
    """Residual blocks (conv-bn-relu-conv-bn-add-relu) until the graph has `target_nodes` nodes."""
    rng = np.random.default_rng(0)
    x = relay.var("data", shape=("n", 64, 56, 56))

    def conv_bn(h: relay.Expr, relu: bool) -> relay.Expr:
        w = relay.const(rng.standard_normal((64, 64, 3, 3)).astype(np.float32))
        h = relay.nn.conv2d(h, w, strides=(1, 1), padding=(1, 1), channels=64, kernel_size=(3, 3))
        gamma, beta, mean, var = (relay.const(np.ones(64, np.float32)) for _ in range(4))
        h = relay.TupleGetItem(relay.nn.batch_norm(h, gamma, beta, mean, var), 0)
        return relay.nn.relu(h) if relu else h

    h: relay.Expr = x
    while len(post_order(h)) < target_nodes:
        block = conv_bn(conv_bn(h, True), False)
        h = relay.nn.relu(relay.add(block, h))
    h = relay.nn.global_avg_pool2d(h)
    h = relay.nn.batch_flatten(h)
    w = relay.const(rng.standard_normal((1000, 64)).astype(np.float32))
    return relay.Function([x], relay.nn.dense(h, w))


def main() -> None:
    print(f"{'graph':14} {'nodes':>7} {'build s':>9} {'infer s':>9} {'infer us/node':>14}")
    for name, make in (("chain 10k", chain), ("resnet-like", resnet_like)):
        build = median_time(make, repeat=3)
        func = make()
        nodes = len(post_order(func))
        infer = median_time(functools.partial(relay.infer_type, func), repeat=5)
        print(f"{name:14} {nodes:7d} {build:9.3f} {infer:9.3f} {infer / nodes * 1e6:14.1f}")


if __name__ == "__main__":
    main()
