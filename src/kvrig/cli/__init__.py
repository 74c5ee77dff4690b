"""The `kvrig` command (kvrig.cli.command), one module per group of subcommands."""

from kvrig.cli.command import main

__all__ = ["main"]
