"""Subcommands of the placement CLI: one module each, with add_parser() and run()."""
