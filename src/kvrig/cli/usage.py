"""The error a user of any kvrig command can cause: one paragraph on stderr, exit 2."""

from __future__ import annotations


class UsageError(Exception):
    """A one-paragraph message for the user; the command exits 2."""
