"""Tensor expressions and schedules, lowered to loop IR.

Empty until its issue lands; DESIGN.md says what lives here.
"""
