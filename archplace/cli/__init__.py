"""The ``archplace`` command line, the top floor of the package: one module per command group, each a
thin layer over ``archplace.api`` (``archplace.service`` for ``serve``). ``main`` is the entry point."""

from archplace.cli.commands import build_parser, main

__all__ = ["build_parser", "main"]
