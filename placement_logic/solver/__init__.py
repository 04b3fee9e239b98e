"""Solver plumbing shared by ``check`` and ``prove``.

``session``: an explicit z3 context with a time limit, timings and model reading;
``tosmt``: sympy expressions -> z3 terms; ``backends``: SMT-LIB export and the z3 / cvc5
runs of ``placement prove``.
"""
