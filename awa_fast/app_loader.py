"""Resolve an application spec ``"package.module:attribute"`` to the client it names."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any


def load_client(spec: str) -> Any:
    """Import ``module`` and return its ``attribute`` (an :class:`~awa_fast.AsyncClient`).

    The current directory is put on ``sys.path`` first, as ``python -m`` would.

    Raises:
        ValueError: ``spec`` is not ``module:attribute``, or the attribute is missing or not
            an AsyncClient.
        ImportError: the module cannot be imported.
    """
    from awa_fast.client import AsyncClient

    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"application spec must look like 'package.module:client', got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    module = importlib.import_module(module_name)
    try:
        client = getattr(module, attr)
    except AttributeError:
        raise ValueError(f"module {module_name!r} has no attribute {attr!r}") from None
    if not isinstance(client, AsyncClient):
        raise ValueError(f"{spec} is a {type(client).__name__}, not an awa_fast.AsyncClient")
    return client
