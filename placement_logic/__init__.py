"""placement-logic: placement specs in, exact cost formulas and safety verdicts out."""

__version__ = "0.1.0"
