# cython: language_level=3
"""Insert-request validation (compiled hot path).

Every rule here has a pure-Python twin in ``tests/reference_ext.py``; the property
tests in ``tests/test_ext_properties.py`` check that both behave identically.

Rule source: the awa-fast insert contract, which keeps awa-pg's limits
(kind/queue 1..200 characters, priority 1..4, max_attempts 1..1000, at most
20 tags, no NUL characters since Postgres ``text``/``jsonb`` cannot store them,
run_at as an RFC 3339 timestamp within years 1..9999).
"""

from cpython.unicode cimport PyUnicode_GET_LENGTH
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from libc.string cimport memchr

from datetime import date, datetime, timezone

from awa_fast.errors import ValidationError

cdef object _UTC = timezone.utc

cdef Py_ssize_t KIND_MAX_CHARS = 200
cdef Py_ssize_t QUEUE_MAX_CHARS = 200
cdef long PRIORITY_MIN = 1
cdef long PRIORITY_MAX = 4
cdef long MAX_ATTEMPTS_MIN = 1
cdef long MAX_ATTEMPTS_MAX = 1000
cdef Py_ssize_t TAGS_MAX = 20

NUL_LIMIT = "no NUL bytes"
UTF8_LIMIT = "valid UTF-8 (no lone surrogates)"
RUN_AT_TYPES_LIMIT = "datetime, RFC 3339 str or None"
RUN_AT_FORMAT_LIMIT = "RFC 3339 timestamp"
RUN_AT_RANGE_LIMIT = "years 1..9999"


cdef inline bint _has_nul(str s):
    """True if the str contains U+0000 (C loop over code points)."""
    # "\0" in s is a C-level find on the str's native storage; it is the
    # fastest correct scan for all three PEP 393 kinds.
    return "\0" in s


cdef _check_name(object value, str field, Py_ssize_t max_chars):
    cdef Py_ssize_t n
    if not isinstance(value, str):
        raise ValidationError(
            f"{field} must be a str, got {type(value).__name__}",
            field=field,
            limit=f"1..{max_chars} characters",
        )
    n = PyUnicode_GET_LENGTH(value)
    if n < 1 or n > max_chars:
        raise ValidationError(
            f"{field} must be 1 to {max_chars} characters, got {n}",
            field=field,
            limit=f"1..{max_chars} characters",
        )
    if _has_nul(<str>value):
        raise ValidationError(
            f"{field} must not contain NUL characters",
            field=field,
            limit=NUL_LIMIT,
        )
    _check_utf8(<str>value, field)


cdef _check_utf8(str value, str field):
    # Lone surrogates cannot be encoded as UTF-8 (Postgres text would reject them).
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValidationError(f"{field} must be valid Unicode (no lone surrogates)",
                                  field=field, limit=UTF8_LIMIT) from None


cdef _check_int(object value, str field, long lo, long hi):
    # bool is a subclass of int but is rejected on purpose.
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValidationError(
            f"{field} must be an int between {lo} and {hi}, got {type(value).__name__}",
            field=field,
            limit=f"{lo}..{hi}",
        )
    if not (lo <= value <= hi):
        raise ValidationError(
            f"{field} must be between {lo} and {hi}, got {value}",
            field=field,
            limit=f"{lo}..{hi}",
        )


def check_name(value, str field not None):
    """Validate one name: a job kind or a queue name, wherever one enters awa-fast (insert,
    ``task()``, ``start()`` queues, periodic schedules, follow-ups, admin calls, the CLI).

    Args:
        value: any object; a name is a ``str`` of 1..200 characters (code points), without
            U+0000 and without lone surrogates.
        field: ``str``, the field to name in the error (``"kind"``, ``"queue"``,
            ``"queues[2]"``).

    Returns:
        ``str``: ``value``.

    Raises:
        awa_fast.errors.ValidationError(field=field, limit="1..200 characters" |
            "no NUL bytes" | "valid UTF-8 (no lone surrogates)").

    Rule source: the jobs table's ``length(kind) <= 200`` / ``length(queue) <= 200`` (awa's
    limits); a name is never empty; Postgres text cannot hold NUL.
    """
    _check_name(value, field, KIND_MAX_CHARS)
    return value


def validate_insert(kind, queue, priority, max_attempts, tags):
    """Validate the scalar fields of one insert request and return its tags.

    Args:
        kind: ``str``, 1..200 characters (code points, i.e. Python ``len``, not
            bytes), without U+0000.
        queue: ``str``, same rules as ``kind``.
        priority: ``int`` in 1..4 (``bool`` is rejected).
        max_attempts: ``int`` in 1..1000 (``bool`` is rejected).
        tags: ``None`` or a ``list``/``tuple`` of at most 20 ``str``, each
            without U+0000.

    Returns:
        ``list[str]``: the tags as a new list (``[]`` for ``None``).

    Raises:
        awa_fast.errors.ValidationError: on the first broken rule, checked in
            the order kind, queue, priority, max_attempts, tags. ``field`` is the
            argument name, ``limit`` the rule ("1..200 characters", "1..4",
            "1..1000", "<= 20", "no NUL bytes"). Wrong types raise the same
            error with the field's limit.

    Rule source: awa-fast insert contract (awa-pg limits; Postgres text cannot
    hold NUL).
    """
    cdef Py_ssize_t i, n
    cdef list out
    _check_name(kind, "kind", KIND_MAX_CHARS)
    _check_name(queue, "queue", QUEUE_MAX_CHARS)
    _check_int(priority, "priority", PRIORITY_MIN, PRIORITY_MAX)
    _check_int(max_attempts, "max_attempts", MAX_ATTEMPTS_MIN, MAX_ATTEMPTS_MAX)
    if tags is None:
        return []
    if not isinstance(tags, (list, tuple)):
        raise ValidationError(
            f"tags must be a list or tuple of str, got {type(tags).__name__}",
            field="tags",
            limit=f"<= {TAGS_MAX}",
        )
    n = len(tags)
    if n > TAGS_MAX:
        raise ValidationError(
            f"tags: at most {TAGS_MAX} tags, got {n}",
            field="tags",
            limit=f"<= {TAGS_MAX}",
        )
    out = list(tags)
    for i in range(n):
        tag = out[i]
        if not isinstance(tag, str):
            raise ValidationError(
                f"tags[{i}] must be a str, got {type(tag).__name__}",
                field="tags",
                limit=f"<= {TAGS_MAX}",
            )
        if _has_nul(<str>tag):
            raise ValidationError(
                f"tags[{i}] must not contain NUL characters",
                field="tags",
                limit=NUL_LIMIT,
            )
        _check_utf8(<str>tag, "tags")
    return out


def check_json_nul(bytes data not None, str field not None):
    """Reject JSON that encodes a NUL character anywhere.

    Args:
        data: ``bytes``, compact UTF-8 JSON as produced by ``orjson.dumps``.
        field: ``str``, the field name to report (e.g. ``"args"``).

    Returns:
        ``None``.

    Raises:
        awa_fast.errors.ValidationError(field=field, limit="no NUL bytes"): if
            the JSON contains the escape ``\\u0000`` that is itself not escaped,
            i.e. preceded by an even number (including zero) of further
            backslashes, in a string value or key at any depth. A raw 0x00
            byte anywhere (never produced by orjson; invalid JSON) is
            rejected too.
        TypeError: if ``data`` is not ``bytes`` or ``field`` not ``str``.

    Rule source: Postgres ``jsonb`` cannot store U+0000.
    The scan is a C loop (memchr from backslash to backslash); escapes are
    consumed in pairs so backslash parity is tracked without look-behind.
    """
    cdef const unsigned char* p = <const unsigned char*> PyBytes_AS_STRING(data)
    cdef Py_ssize_t n = PyBytes_GET_SIZE(data)
    cdef Py_ssize_t i = 0
    cdef const unsigned char* q
    # A raw 0x00 byte anywhere counts (invalid JSON, never from orjson).
    cdef bint found = memchr(p, 0, <size_t> n) != NULL
    while not found:
        # Jump to the next backslash; each one starts an escape that is
        # consumed together with its next byte, so parity needs no look-behind.
        q = <const unsigned char*> memchr(p + i, 92, <size_t> (n - i))
        if q == NULL:
            break
        i = q - p
        if (
            i + 5 < n
            and p[i + 1] == 117  # 'u'
            and p[i + 2] == 48   # '0'
            and p[i + 3] == 48
            and p[i + 4] == 48
            and p[i + 5] == 48
        ):
            found = True
        i += 2
        if i >= n:
            break
    if found:
        raise ValidationError(
            f"{field} must not contain NUL characters (\\u0000)",
            field=field,
            limit=NUL_LIMIT,
        )


def normalize_run_at(value):
    """Normalize a ``run_at`` value to an aware UTC ``datetime`` (or ``None``).

    Args:
        value: ``None``; a ``datetime.datetime`` (naive is taken as UTC, aware
            is converted to UTC); or a ``str`` parsed with
            ``datetime.fromisoformat`` (a trailing ``"Z"``/``"z"`` is accepted
            as ``+00:00``).

    Returns:
        ``datetime | None``: aware, ``tzinfo=timezone.utc``.

    Raises:
        awa_fast.errors.ValidationError(field="run_at"):
            limit="datetime, RFC 3339 str or None" for a ``date`` that is not a
            ``datetime`` or any other type; limit="RFC 3339 timestamp" for an
            unparseable str; limit="years 1..9999" when the UTC result falls
            outside years 1..9999 (conversion overflow).

    Rule source: awa-fast insert contract (Postgres timestamptz, Python
    datetime range).
    """
    if value is None:
        return None
    if isinstance(value, str):
        text = <str>value
        if text.endswith("Z") or text.endswith("z"):
            text = text[: len(text) - 1] + "+00:00"
        try:
            value = datetime.fromisoformat(text)
        except (ValueError, TypeError):
            raise ValidationError(
                f"run_at must be an RFC 3339 timestamp, got {value!r}",
                field="run_at",
                limit=RUN_AT_FORMAT_LIMIT,
            ) from None
    elif not isinstance(value, datetime):
        kind = "date" if isinstance(value, date) else type(value).__name__
        raise ValidationError(
            f"run_at must be a datetime, an RFC 3339 str or None, got {kind}",
            field="run_at",
            limit=RUN_AT_TYPES_LIMIT,
        )
    if value.utcoffset() is None:
        return value.replace(tzinfo=_UTC)
    try:
        return value.astimezone(_UTC)
    except (OverflowError, ValueError):
        raise ValidationError(
            f"run_at must fall within years 1..9999 in UTC, got {value.isoformat()}",
            field="run_at",
            limit=RUN_AT_RANGE_LIMIT,
        ) from None


def derive_kind(str name not None):
    """Derive a job kind from a CamelCase class name, as awa does.

    Args:
        name: ``str`` (any length; Unicode case rules of ``str.isupper`` etc.).

    Returns:
        ``str``: snake_case. An ``"_"`` goes before an uppercase character
        (not the first) whose previous character is lowercase or a digit, or
        whose previous character is uppercase and next character lowercase;
        the result is then lowercased. E.g. ``SMTPEmail -> smtp_email``,
        ``ProcessV2Import -> process_v2_import``.

    Raises:
        TypeError: if ``name`` is not a ``str``.

    Rule source: awa's kind derivation (CamelCase to snake_case).
    """
    cdef Py_ssize_t n = PyUnicode_GET_LENGTH(name)
    cdef Py_ssize_t i
    cdef Py_UCS4 c, prev, nxt
    cdef list parts = []
    cdef Py_ssize_t start = 0
    if n == 0:
        return ""
    for i in range(1, n):
        c = name[i]
        if not c.isupper():
            continue
        prev = name[i - 1]
        if prev.islower() or prev.isdigit():
            pass
        elif prev.isupper() and i + 1 < n:
            nxt = name[i + 1]
            if not nxt.islower():
                continue
        else:
            continue
        parts.append(name[start:i])
        start = i
    if start == 0:
        return name.lower()
    parts.append(name[start:])
    return "_".join(parts).lower()
