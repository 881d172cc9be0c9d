"""Resolve an application spec ``"package.module:attribute"`` to the client it names."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any


class AppSpecError(Exception):
    """A ``module:attribute`` spec that does not name an ``AsyncClient``."""


def load_client(spec: str) -> tuple[Any, Any]:
    """Import ``module:attr`` (``attr`` may be dotted) and return ``(client, module)``.

    Raises:
        AppSpecError: malformed spec, module not found, missing attribute, or not an AsyncClient.
        Exception: whatever importing the module raised (an application error).
    """
    from awa_fast.client import AsyncClient

    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise AppSpecError(f"invalid application {spec!r}: expected 'module:client'")
    if os.getcwd() not in sys.path:  # as `python -m` would
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise AppSpecError(f"cannot import module {module_name!r}: {exc} (searched the "
                               f"current directory {os.getcwd()}, then sys.path)") from exc
        raise
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise AppSpecError(f"module {module_name!r} has no attribute {attr!r}") from None
    if not isinstance(obj, AsyncClient):
        raise AppSpecError(f"{spec} is a {type(obj).__name__}, not an awa_fast AsyncClient")
    return obj, module
