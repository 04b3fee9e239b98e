"""placement-logic: placement specs in, exact cost formulas and safety verdicts out.

The public API. Importing the package is cheap: sympy, z3, cvc5 and torch are imported
only when a function that needs them is first used. (The functions are not named like the
subpackages, ``check`` or ``prove``, which importing them would shadow.)

>>> import placement_logic as pl
>>> spec = pl.load_string("from std.data import zero3  model { params = 1e9 }  mesh { dp = 8 }  "
...                       "plan p { dp: zero3 }")
>>> pl.check_spec(spec).verdict.word
'proved'
>>> print(pl.cost_report(spec).plans[0].device["params"].exact)
250000000
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "load_spec",
    "load_string",
    "derive_costs",
    "cost_report",
    "check_spec",
    "prove_theorems",
    "import_hf",
    "import_deepspeed",
    "import_megatron",
    "import_torchtitan",
    "export_plan",
    "Verdict",
    "DiagnosticError",
]


def load_spec(path):
    """Parse, load the imports of and resolve a ``.place`` file: an ``ir.Spec``.
    Bad input raises ``DiagnosticError`` (every diagnostic, located)."""
    from .frontend.loader import load_spec as _load

    return _load(path)


def load_string(text: str, file: str = "<string>", base_dir=None):
    """The same for source text; ``file`` names it in diagnostics, imports resolve from ``base_dir``."""
    from .frontend.loader import load_string as _load

    return _load(text, file, base_dir)


def derive_costs(plan):
    """Memory, activations and communication of one ``ir.Plan`` as exact sympy expressions."""
    from . import costs

    return costs.derive(plan)


def cost_report(spec, sets=None):
    """The cost report of a spec (every plan; symbols bound by the spec and by ``sets``), as
    plain data: what ``placement cost`` renders."""
    from .costreport import build

    return build(spec, sets=sets or {})


def check_spec(spec, plans=None, pinned=None, timeout: float = 10.0):
    """Prove or refute every safety obligation of the spec's plans (all mesh sizes unless pinned)."""
    from .check.run import check_spec as _check

    return _check(spec, plans=plans, pinned=pinned, timeout=timeout)


def prove_theorems(specs=(), timeout: float = 10.0):
    """The framework's theorems (and the claims of ``specs``): a report and the SMT-LIB texts."""
    from .prove import prove as _prove

    return _prove(list(specs), timeout=timeout)


def import_hf(path):
    """A spec whose model is a Hugging Face ``config.json`` (no mesh, no plans): ``spec.model``
    is what ``model from "config.json"`` gives; costs need a mesh and a plan around it."""
    from .frontend.loader import load_string as _load
    from .interop.imports import hf_block

    return _load(hf_block(str(path)), str(path))


def _warn(spec, problems: list[str]):
    import warnings

    for p in problems:
        warnings.warn(f"not expressed: {p}", UserWarning, stacklevel=3)
    return spec


def import_deepspeed(config, devices: int, model=None, params=None, seq=None):
    """The spec of a DeepSpeed config (a dict, or the path of its JSON) on ``devices`` devices,
    with the model from a Hugging Face config (``model``, a path) or a parameter count, and the
    sequence length ``seq`` (which lives in the data pipeline, not the config)."""
    import json
    from pathlib import Path

    from .frontend.loader import load_string as _load
    from .interop.frameworks import deepspeed_to_spec

    text, name = (json.dumps(config), "<dict>") if isinstance(config, dict) else (Path(config).read_text(), str(config))
    problems: list[str] = []
    spec = _load(deepspeed_to_spec(text, name, devices, str(model) if model else None, params, seq, problems), name)
    return _warn(spec, problems)


def import_megatron(args, devices: int):
    """The spec of Megatron-LM arguments (a string or a list of them) on ``devices`` devices."""
    import shlex

    from .frontend.loader import load_string as _load
    from .interop.frameworks import megatron_to_spec

    text = args if isinstance(args, str) else shlex.join(args)
    problems: list[str] = []
    return _warn(_load(megatron_to_spec(text, "<arguments>", devices, problems), "<arguments>"), problems)


def import_torchtitan(config, devices: int, model=None, params=None):
    """The spec of a torchtitan job config (TOML text, or the path of a .toml file)."""
    from pathlib import Path

    from .frontend.loader import load_string as _load
    from .interop.torchtitan import torchtitan_to_spec

    path = Path(config) if not str(config).lstrip().startswith("[") and Path(str(config)).is_file() else None
    text, name = (path.read_text(), str(path)) if path else (str(config), "<toml>")
    problems: list[str] = []
    return _warn(_load(torchtitan_to_spec(text, name, devices, str(model) if model else None, params, problems),
                       name), problems)


def export_plan(spec, plan: str, framework: str):
    """A plan as ``framework``'s configuration (deepspeed: a dict; megatron: a list of
    arguments; torchtitan: TOML text) and the list of what that framework cannot express."""
    from .interop import frameworks as fw
    from .interop.torchtitan import plan_to_torchtitan

    p = spec.plan(plan)
    if framework == "deepspeed":
        return fw.plan_to_deepspeed(spec, p)
    if framework == "megatron":
        return fw.plan_to_megatron(spec, p)
    if framework == "torchtitan":
        return plan_to_torchtitan(spec, p)
    raise ValueError(f"unknown framework {framework!r}: deepspeed, megatron or torchtitan")


def __getattr__(name: str):
    if name == "Verdict":
        from .outcome import Verdict

        return Verdict
    if name == "DiagnosticError":
        from .diagnostics import DiagnosticError

        return DiagnosticError
    raise AttributeError(f"module 'placement_logic' has no attribute {name!r}")
