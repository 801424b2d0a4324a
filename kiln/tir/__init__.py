"""The loop IR, its simplifier and passes.

Empty until its issue lands; DESIGN.md says what lives here.
"""
