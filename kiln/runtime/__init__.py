"""Device arrays, the executable format, the executor and memory planning.

Empty until its issue lands; DESIGN.md says what lives here.
"""
