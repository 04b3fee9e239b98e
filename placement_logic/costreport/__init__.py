"""Cost reports: ``build`` (spec -> report model) and the renderers (report -> text)."""

from .build import build, symbolic_value
from .model import SCHEMA_VERSION, CostReport, PlanReport, Quantity

__all__ = ["build", "symbolic_value", "SCHEMA_VERSION", "CostReport", "PlanReport", "Quantity"]
