"""``python -m placement_logic`` runs the ``placement`` command."""

from .cli import main

raise SystemExit(main())
