"""Relay: the typed graph IR, its op library, passes, text format, frontends and relay.build.

Empty until its issue lands; DESIGN.md says what lives here.
"""
