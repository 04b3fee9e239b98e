"""The front end: source text -> surface tree -> (imports loaded) -> resolved IR.

Modules, in the order text flows through them: ``parser`` (lark, the canonical grammar ->
``surface`` tree via ``lower``), ``canonical`` (surface tree -> canonical source text, the
``placement fmt`` formatter), ``loader`` (files and ``std.*`` library modules -> one
``ir.Spec``, calling the ``resolve`` package). Nothing here imports sympy, z3 or torch.
"""
