"""The dashboard's input rules: a query or form value that breaks one is a 400 page."""

from __future__ import annotations

import re
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request

from awa_fast.errors import ValidationError
from awa_fast.requests import check_name
from awa_fast.web.rendering import STATES

MAX_ID = 2**63 - 1
_DIGITS = re.compile(r"[0-9]{1,19}")  # MAX_ID has 19 digits


def bad(message: str) -> HTTPException:
    """The 400 page's exception, saying ``message``."""
    return HTTPException(400, message)


def positive_id(text: str | None, field: str) -> int | None:
    """``text`` as an id (1..2**63-1), None when empty; a 400 naming ``field`` otherwise."""
    if text is None or text == "":
        return None
    # ASCII digits only (str.isdigit() accepts "²", which int() rejects); the length bound keeps
    # int() off strings past its digit limit.
    value = int(text) if _DIGITS.fullmatch(text) else 0
    if not 1 <= value <= MAX_ID:
        raise bad(f"{field} must be an integer between 1 and {MAX_ID}, got {text[:40]!r}")
    return value


def path_id(request: Request) -> int:
    """The ``{job_id}`` of the request's path (a 400 unless an id)."""
    return positive_id(request.path_params["job_id"], "job id")  # type: ignore[return-value]


def name(value: object, field: str) -> str | None:
    """A queue or kind name (the one name rule), None when empty; a 400 naming ``field``
    for a file upload or a name the rule refuses."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):  # a multipart form may carry a file in any field
        raise bad(f"{field} must be text, not a file upload")
    try:
        return check_name(value, field)
    except ValidationError as exc:
        raise bad(str(exc)) from None


def queue_field(form: Any) -> str:
    """The form's ``queue`` (it travels in the form, not the path: a name may contain "/")."""
    queue = name(form.get("queue"), "queue")
    if queue is None:
        raise bad("the form names no queue")
    return queue


def state(text: str | None) -> str | None:
    """A job state filter, None when empty; a 400 for a state that does not exist."""
    if text is None or text == "":
        return None
    if text not in STATES:
        raise bad(f"state must be one of {', '.join(STATES)}; got {text[:40]!r}")
    return text
