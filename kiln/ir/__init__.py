"""The IR foundation: nodes, dtypes, types, attrs, spans and diagnostics, IRModule and the pass infrastructure.

Empty until its issue lands; DESIGN.md says what lives here.
"""
