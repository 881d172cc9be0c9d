"""Typed job args: a dataclass or ``msgspec.Struct`` goes to JSON at insert and comes back to
the handler as the declared field types (``datetime``, ``date``, ``Decimal``, ``bytes``,
``UUID``, ``set``, ``tuple``, nested dataclasses ...), through msgspec.

At insert, a value that would not come back equal (a ``datetime`` in a field declared ``Any``
or ``str``, a NaN, a value of the wrong type) is rejected with a ``ValidationError`` naming the
field, so a handler never sees a different value than the producer sent. Types whose fields are
all plain JSON (``str``, ``int``, ``float``, ``bool``, ``None`` and lists/dicts of them) skip the
check (decided once per type).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from typing import Any, cast

import msgspec

from awa_fast.errors import ValidationError

_PLAIN = (str, int, float, bool, type(None))
_needs_check: dict[type, bool] = {}


def _plain(hint: Any) -> bool:
    if hint in _PLAIN:
        return True
    origin = typing.get_origin(hint)
    if origin in (list, dict, typing.Union, types.UnionType):
        return all(_plain(a) for a in typing.get_args(hint))
    return False


def _fields(cls: type) -> list[str]:
    if dataclasses.is_dataclass(cls):
        return [f.name for f in dataclasses.fields(cls)]
    # not a dataclass: a msgspec.Struct, the other args type with declared fields
    return list(cast(type[msgspec.Struct], cls).__struct_fields__)


def needs_check(cls: type) -> bool:
    """Whether values of ``cls`` can differ after a JSON round trip (cached per type)."""
    known = _needs_check.get(cls)
    if known is None:
        try:
            hints = typing.get_type_hints(cls)
            known = not all(_plain(hints.get(name, Any)) for name in _fields(cls))
        except Exception:  # unresolvable annotations: msgspec cannot decode them either
            known = False
        _needs_check[cls] = known
    return known


def _same(sent: Any, got: Any) -> bool:
    numbers = (int, float)
    if (
        isinstance(sent, numbers)
        and isinstance(got, numbers)
        and not isinstance(sent, bool)
        and not isinstance(got, bool)
    ):
        return sent == got  # 1 in a float field arrives as 1.0: the same number
    if type(sent) is not type(got):
        return False
    if dataclasses.is_dataclass(sent) or isinstance(sent, msgspec.Struct):
        return msgspec.to_builtins(sent) == msgspec.to_builtins(got)  # eq=False types
    return sent == got


def check_round_trip(args: Any, builtins: dict) -> None:
    """Raise :class:`ValidationError` (field ``args.<name>``) if ``args`` (a dataclass or
    Struct instance) would not decode back to equal field values from ``builtins``."""
    cls = type(args)
    if not needs_check(cls):
        return
    try:
        back = msgspec.convert(builtins, cls)
    except msgspec.ValidationError as exc:
        path = str(exc).rsplit("`$.", 1)[-1].rstrip("`") if "`$." in str(exc) else ""
        raise ValidationError(
            f"args.{path or '?'}: does not round-trip through JSON as its declared type ({exc})",
            field=f"args.{path}" if path else "args",
            limit="declared field type",
        ) from None
    except Exception:  # a type msgspec cannot decode: the handler gets awa's plain decoding
        return
    for name in _fields(cls):
        sent, got = getattr(args, name), getattr(back, name)
        if not _same(sent, got):
            raise ValidationError(
                f"args.{name}: {type(sent).__name__} value {sent!r} would reach the handler as "
                f"{type(got).__name__} {got!r}; declare the field's type or convert the value",
                field=f"args.{name}",
                limit="declared field type",
            )


def dataclass_decoder(cls: type) -> Callable[[dict], Any]:
    """Decode a stored args dict into dataclass ``cls`` with the declared field types. Keys the
    dataclass does not declare (or any value msgspec cannot convert) get awa's plain
    ``cls(**raw)``, which raises as awa-pg does."""
    names = frozenset(_fields(cls))

    def decode(raw: dict) -> Any:
        if not names.issuperset(raw):
            return cls(**raw)
        try:
            return msgspec.convert(raw, cls)
        except Exception:
            return cls(**raw)

    return decode
