"""Turns what a handler produced into values PostgreSQL will always accept.

Whatever a handler raises or returns ends up in a ``text``/``jsonb`` column: error messages and
tracebacks, ``Cancel`` reasons, progress and metadata. PostgreSQL rejects a NUL character in
both and a lone surrogate cannot be encoded as UTF-8; an exception's ``__str__`` may itself
raise. One failing value used to keep the whole attempt from finalizing, so every such value
goes through this module first (issue 9, class 2):

* :func:`describe` -- ``str(value)`` that never raises;
* :func:`text` -- NUL written as the four characters ``\\x00``, lone surrogates as
  ``\\udXXX`` escapes, cut to ``MAX_TEXT_CHARS`` characters with a marker that says so;
* :func:`json_text` -- JSON for a ``jsonb`` column built from any value: strings as in
  :func:`text`, keys stringified, values JSON cannot hold (objects, integers beyond 64 bits)
  replaced by their :func:`describe` text, nesting cut at ``MAX_DEPTH``;
* :func:`check_progress` -- the strict form for values a handler hands us *during* the attempt
  (``set_progress``, ``update_metadata``): rejected at the call with a ``ValidationError``.
"""

from __future__ import annotations

from typing import Any

import orjson

from awa_fast.errors import ValidationError
from awa_fast.requests import to_json

MAX_TEXT_CHARS = 16_384  # one stored error message / reason / string value, in characters
MAX_PROGRESS_BYTES = 65_536  # a job's progress (message + metadata) as JSON, in bytes
MAX_DEPTH = 32


def describe(value: Any) -> str:
    """``str(value)``, falling back to ``repr`` and then to a placeholder naming the type when
    those raise (any exception, including ``BaseException`` subclasses)."""
    for render in (str, repr):
        try:
            out = render(value)
            if isinstance(out, str):
                return out
        except BaseException:
            continue
    try:
        name = type(value).__qualname__
    except BaseException:
        name = "object"
    return f"<unprintable {name}>"


def text(value: Any, limit: int = MAX_TEXT_CHARS) -> str:
    """A storable form of ``value`` (see the module docstring); at most ``limit`` characters
    plus the truncation marker."""
    s = value if isinstance(value, str) else describe(value)
    if len(s) > limit:
        s = f"{s[:limit]}... [truncated: {limit} of {len(s)} characters kept]"
    if "\x00" in s:
        s = s.replace("\x00", "\\x00")
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        s = s.encode("utf-8", "backslashreplace").decode("utf-8")
    return s


def _clean(value: Any, depth: int) -> Any:
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return text(value)
    if isinstance(value, int):
        return value if -(2**63) <= value < 2**64 else str(value)
    if isinstance(value, float):
        return value  # orjson writes NaN/inf as null
    if depth >= MAX_DEPTH:
        return text(value)
    if isinstance(value, dict):
        return {text(k): _clean(v, depth + 1) for k, v in list(value.items())}
    if isinstance(value, (list, tuple)):
        return [_clean(v, depth + 1) for v in list(value)]
    return text(value)


def json_text(value: Any) -> str:
    """JSON text of ``value`` that a ``jsonb`` column always accepts; never raises."""
    try:
        return orjson.dumps(_clean(value, 0)).decode()
    except BaseException:
        return orjson.dumps(text(value)).decode()


def check_progress(value: Any, field: str) -> None:
    """Reject, at the handler's call, a progress value that could not be stored.

    Raises:
        SerializationError: ``value`` is not JSON-serializable (an object, an integer beyond
            64 bits, a lone surrogate); ``field`` names it, ``limit`` says ``JSON``.
        ValidationError: it holds a NUL character, or its JSON is larger than
            ``MAX_PROGRESS_BYTES`` (64 KiB) bytes.
    """
    data = to_json(value, field)
    if len(data) > MAX_PROGRESS_BYTES:
        raise ValidationError(
            f"{field} is {len(data)} bytes as JSON; at most {MAX_PROGRESS_BYTES} allowed",
            field=field,
            limit=f"<= {MAX_PROGRESS_BYTES} bytes",
        )
