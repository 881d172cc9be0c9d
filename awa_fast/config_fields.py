"""The field helper of the typed configuration classes (``worker/config/``, ``MaintenanceConfig``,
``LauncherConfig``, ``ConnectionConfig``; ADR 040): each field carries its unit and what it is, so
:func:`describe` can list them and a test can check that none is left undocumented. A leaf
module (it imports nothing of awa_fast), so every config class may use it."""

from __future__ import annotations

import dataclasses
from typing import Any

REQUIRED: Any = dataclasses.MISSING  # the default of a field :func:`doc` makes required


def doc(default: Any, unit: str, text: str, *, factory: Any = None) -> Any:
    """A dataclass field of a config class with its ``default`` (or ``factory``, called for
    each instance), ``unit`` (``"ms"``, ``"hours"``, ``"count"``, ``"bool"``, ...) and what it
    is (``text``), kept in the field's metadata (:func:`describe` lists them; a test checks
    every field has both)."""
    metadata = {"unit": unit, "doc": text}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    if default is REQUIRED:
        return dataclasses.field(metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def describe(config_class: type) -> list[tuple[str, str, Any, str]]:
    """``(name, unit, default, doc)`` of every field of the dataclass ``config_class``; the
    default is ``dataclasses.MISSING`` for a required field."""
    out = []
    for f in dataclasses.fields(config_class):
        default: Any = f.default
        if f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        out.append((f.name, f.metadata.get("unit", ""), default, f.metadata.get("doc", "")))
    return out
