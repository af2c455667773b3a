"""The families of ``fastread bench`` modes, one module each.

Every module here (not starting with ``_``) is found by
:func:`fastread.bench.registry.families`; the interface a module implements
(``NAME``, ``ORDER``, ``modes(env)``) is documented in
:mod:`fastread.bench.registry`.
"""
