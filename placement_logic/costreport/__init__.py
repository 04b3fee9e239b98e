"""Cost reports: ``build`` (spec -> report model) and the renderers (report -> text)."""

from .build import build, symbolic_value
from .latex import render_equations
from .model import SCHEMA_VERSION, CostReport, PlanReport, Quantity

CostReport._repr_latex_ = render_equations  # Jupyter shows a report as its equations

__all__ = ["build", "symbolic_value", "SCHEMA_VERSION", "CostReport", "PlanReport", "Quantity"]
