"""The CLI's two errors: one reported with exit status 1, a usage error with 2."""

from __future__ import annotations

import argparse


class CliError(Exception):
    """An error reported as ``awa-fast: error: <message>`` with exit status 1."""


class UsageError(Exception):
    """A command-line usage error (exit status 2): what the command table's parsers raise
    instead of printing and exiting, so that :func:`~awa_fast.cli.main` reports it in the
    requested format."""

    def __init__(self, message: str, parser: argparse.ArgumentParser):
        super().__init__(message)
        self.message = message
        self.parser = parser
