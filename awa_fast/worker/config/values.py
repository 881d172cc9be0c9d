"""The checks of one setting's value: counts, durations and flags given to ``start()``, each
refused with a ``ConfigError`` naming the field and the limit. The typed configuration
(``worker/config/runtime.py``, ``queues.py``) is built from these."""

from __future__ import annotations

import math
from typing import Any

from awa_fast.config_fields import REQUIRED, describe, doc
from awa_fast.errors import ConfigError

__all__ = [
    "MAX_SETTING_INT",
    "MAX_SETTING_S",
    "REQUIRED",
    "describe",
    "doc",
    "flag",
    "int_setting",
    "positive",
    "setting",
]

# The largest count or millisecond value a setting may give: PostgreSQL's int4, the type of
# lock_timeout and of the LIMITs the passes run (beyond it every pass would fail).
MAX_SETTING_INT = 2**31 - 1
# The longest duration a setting may give: beyond it PostgreSQL's interval and timestamp
# arithmetic overflows (a pass would fail every time).
MAX_SETTING_S = 100 * 365 * 86_400
_UNIT_S = {"_ms": 0.001, "_hours": 3600, "_days": 86_400}


def setting(
    value: Any,
    field: str,
    *,
    integer: bool = False,
    zero: bool = False,
    awa_retention: bool = False,
) -> float:
    """A maintenance interval, retention or size given to ``start()``: a finite number > 0
    (``>= 0`` with ``zero``; an int for ``integer``). In milliseconds (a name ending ``_ms``) at
    least 1 and at most ``MAX_SETTING_INT`` (about 24.8 days: PostgreSQL's ``lock_timeout``);
    a count at most ``MAX_SETTING_INT``; in hours or days at most ``MAX_SETTING_S``, except
    awa's retentions (``awa_retention``), which ``maintenance.check_retention`` bounds by awa's
    own limit.

    Raises:
        ConfigError: naming ``field`` and the limit.
    """
    kinds = (int,) if integer else (int, float)
    if (
        isinstance(value, bool)
        or not isinstance(value, kinds)
        or not math.isfinite(value)
        or value < 0
        or (value == 0 and not zero)
    ):
        what = "an int" if integer else "a finite number"
        raise ConfigError(
            f"{field} must be {what} {'>= 0' if zero else '> 0'}, got {value!r}",
            field=field,
            limit=">= 0" if zero else "> 0",
        )
    if field.endswith("_ms") and not 1 <= value <= MAX_SETTING_INT:
        raise ConfigError(
            f"{field}={value!r} is out of range: at least 1 ms, at most {MAX_SETTING_INT} ms "
            "(about 24.8 days, PostgreSQL's lock_timeout)",
            field=field,
            limit=f">= 1 and <= {MAX_SETTING_INT}",
        )
    if integer and value > MAX_SETTING_INT:
        raise ConfigError(
            f"{field}={value!r} is larger than {MAX_SETTING_INT} (PostgreSQL's int4)",
            field=field,
            limit=f"<= {MAX_SETTING_INT}",
        )
    unit = next((u for suffix, u in _UNIT_S.items() if field.endswith(suffix)), None)
    if unit is not None and not awa_retention and value * unit > MAX_SETTING_S:
        raise ConfigError(
            f"{field}={value!r} is longer than 100 years (PostgreSQL's interval "
            "arithmetic would overflow)",
            field=field,
            limit=f"<= {MAX_SETTING_S / unit:.0f}",
        )
    return value


def int_setting(value: Any, field: str, default: int) -> int:
    """:func:`setting` of an int ``value`` (``default`` when ``None``).

    Raises:
        ConfigError: as :func:`setting`.
    """
    return int(setting(default if value is None else value, field, integer=True))


def positive(value: Any, what: str) -> int:
    """``value``, an int from 1 to ``MAX_SETTING_INT``; ``what`` names it ("<queue>:
    max_workers"), its last word is the error's field.

    Raises:
        ConfigError: naming the field and the limit.
    """
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= MAX_SETTING_INT:
        raise ConfigError(
            f"{what} must be a positive int at most {MAX_SETTING_INT}, got {value!r}",
            field=what.rsplit(" ", 1)[-1],
            limit=f"> 0 and <= {MAX_SETTING_INT}",
        )
    return value


def flag(value: Any, field: str, *, optional: bool = False) -> Any:
    """A ``bool`` keyword of ``start()`` (``None`` too when ``optional``): a string such as
    ``"no"`` would otherwise count as true.

    Raises:
        ConfigError: naming ``field``.
    """
    if isinstance(value, bool) or (optional and value is None):
        return value
    raise ConfigError(
        f"{field} must be a bool{' or None' if optional else ''}, got {value!r}",
        field=field,
        limit="bool",
    )
