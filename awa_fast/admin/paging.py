"""Paging arguments of the admin reads and purges (``limit``, ``before_id``), checked before any
statement runs: the database would refuse them with an error naming neither the argument nor
its range ("bigint out of range", "LIMIT must not be negative")."""

from __future__ import annotations

from awa_fast.errors import ValidationError

MAX_BIGINT = 2**63 - 1


def positive(value: object, field: str) -> int:
    """``value`` as an int in 1..2**63-1.

    Raises:
        ValidationError: ``field`` names the argument, ``limit`` the range.
    """
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_BIGINT:
        raise ValidationError(
            f"{field} must be an int 1-{MAX_BIGINT}, got {value!r}",
            field=field,
            limit=f"1-{MAX_BIGINT}",
        )
    return value


def positive_or_none(value: object, field: str) -> int | None:
    """:func:`positive`, with ``None`` (no bound) passing."""
    return None if value is None else positive(value, field)
