"""Compiled hot-path modules (built from the top-level _ext/ sources)."""
