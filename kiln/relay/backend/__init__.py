"""Lowering Relay to compiled kernels (te_compiler) and relay.build."""
