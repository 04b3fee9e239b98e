"""``python -m placement_logic`` runs the ``placement`` command."""

from .cli import console

console()
