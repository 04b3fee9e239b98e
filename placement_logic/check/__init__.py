"""The safety checker: checked plans in, proved / refuted / unknown obligations out.

Stages, each a module: ``steps`` (plan -> step model, from the collective schedule and
the overrides), ``encode`` (step model -> z3 negations of the obligations, in a
``session.Session``), ``replay``, ``replay_state`` and ``replay_norm`` (solver witness -> concrete run in
Fractions -> counterexample), ``run`` (the driver), ``report`` (plain report data),
``render`` (text, Markdown, JSON) and ``rules`` (the rule catalogue).

API: ``run.check_spec(spec, plans=None, pinned=None, timeout=10.0) -> report.CheckReport``
and ``render.render(report, "text" | "markdown" | "json") -> str``. Importing this package
imports nothing else, so the renderers stay free of z3.
"""
