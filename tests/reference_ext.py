"""Pure-Python reference of the compiled modules in awa_fast._ext.

Written for clarity, not speed. tests/enqueue/test_ext_properties.py checks that the
compiled functions return the same values and raise the same errors (type,
field/reason, limit, message) as these on generated inputs.
"""

from __future__ import annotations

import operator
import re
from datetime import UTC, date, datetime

from blake3 import blake3

from awa_fast.errors import StagingError, ValidationError

# --------------------------------------------------------------------------- validate

NUL_LIMIT = "no NUL bytes"
_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1


def _check_name(value, field, max_chars):
    limit = f"1..{max_chars} characters"
    if not isinstance(value, str):
        raise ValidationError(
            f"{field} must be a str, got {type(value).__name__}", field=field, limit=limit
        )
    if not 1 <= len(value) <= max_chars:
        raise ValidationError(
            f"{field} must be 1 to {max_chars} characters, got {len(value)}",
            field=field,
            limit=limit,
        )
    if "\x00" in value:
        raise ValidationError(
            f"{field} must not contain NUL characters", field=field, limit=NUL_LIMIT
        )
    _check_utf8(value, field)


def _check_utf8(value, field):
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValidationError(
            f"{field} must be valid Unicode (no lone surrogates)",
            field=field,
            limit="valid UTF-8 (no lone surrogates)",
        ) from None


def _check_int(value, field, lo, hi):
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValidationError(
            f"{field} must be an int between {lo} and {hi}, got {type(value).__name__}",
            field=field,
            limit=f"{lo}..{hi}",
        )
    if not lo <= value <= hi:
        raise ValidationError(
            f"{field} must be between {lo} and {hi}, got {value}", field=field, limit=f"{lo}..{hi}"
        )


def check_name(value, field):
    _check_name(value, field, 200)
    return value


def validate_insert(kind, queue, priority, max_attempts, tags):
    _check_name(kind, "kind", 200)
    _check_name(queue, "queue", 200)
    _check_int(priority, "priority", 1, 4)
    _check_int(max_attempts, "max_attempts", 1, 1000)
    if tags is None:
        return []
    if not isinstance(tags, (list, tuple)):
        raise ValidationError(
            f"tags must be a list or tuple of str, got {type(tags).__name__}",
            field="tags",
            limit="<= 20",
        )
    if len(tags) > 20:
        raise ValidationError(
            f"tags: at most 20 tags, got {len(tags)}", field="tags", limit="<= 20"
        )
    out = list(tags)
    for i, tag in enumerate(out):
        if not isinstance(tag, str):
            raise ValidationError(
                f"tags[{i}] must be a str, got {type(tag).__name__}", field="tags", limit="<= 20"
            )
        if "\x00" in tag:
            raise ValidationError(
                f"tags[{i}] must not contain NUL characters", field="tags", limit=NUL_LIMIT
            )
        _check_utf8(tag, "tags")
    return out


# \u0000 not itself escaped: preceded by an even number of backslashes that are
# not preceded by another backslash. A raw 0x00 byte also counts.
_JSON_NUL = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000|\x00")


def check_json_nul(data, field):
    if not isinstance(data, bytes):
        raise TypeError(f"data must be bytes, got {type(data).__name__}")
    if not isinstance(field, str):
        raise TypeError(f"field must be str, got {type(field).__name__}")
    if _JSON_NUL.search(data):
        raise ValidationError(
            f"{field} must not contain NUL characters (\\u0000)", field=field, limit=NUL_LIMIT
        )


def normalize_run_at(value):
    if value is None:
        return None
    if isinstance(value, str):
        text = value
        if text.endswith(("Z", "z")):
            text = text[:-1] + "+00:00"
        try:
            value = datetime.fromisoformat(text)
        except (ValueError, TypeError):
            raise ValidationError(
                f"run_at must be an RFC 3339 timestamp, got {value!r}",
                field="run_at",
                limit="RFC 3339 timestamp",
            ) from None
    elif not isinstance(value, datetime):
        kind = "date" if isinstance(value, date) else type(value).__name__
        raise ValidationError(
            f"run_at must be a datetime, an RFC 3339 str or None, got {kind}",
            field="run_at",
            limit="datetime, RFC 3339 str or None",
        )
    if value.utcoffset() is None:
        return value.replace(tzinfo=UTC)
    try:
        return value.astimezone(UTC)
    except (OverflowError, ValueError):
        raise ValidationError(
            f"run_at must fall within years 1..9999 in UTC, got {value.isoformat()}",
            field="run_at",
            limit="years 1..9999",
        ) from None


def derive_kind(name):
    if not isinstance(name, str):
        raise TypeError(f"name must be str, got {type(name).__name__}")
    out = []
    for i, c in enumerate(name):
        if i > 0 and c.isupper():
            prev = name[i - 1]
            nxt = name[i + 1] if i + 1 < len(name) else ""
            if prev.islower() or prev.isdigit() or (prev.isupper() and nxt.islower()):
                out.append("_")
        out.append(c)
    return "".join(out).lower()


# --------------------------------------------------------------------------- unique

DEFAULT_STATES = 31
STATE_BITS = {
    "scheduled": 0,
    "available": 1,
    "running": 2,
    "completed": 3,
    "retryable": 4,
    "failed": 5,
    "cancelled": 6,
    "waiting_external": 7,
}
_KEYS_LIMIT = "dict with keys by_queue, by_args, by_period, states"


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def parse_unique_opts(opts):
    if opts is None:
        return None
    if not isinstance(opts, dict):
        raise ValidationError(
            f"unique_opts must be a dict, got {type(opts).__name__}",
            field="unique_opts",
            limit=_KEYS_LIMIT,
        )
    for key in opts:
        if key not in ("by_queue", "by_args", "by_period", "states"):
            raise ValidationError(
                f"unique_opts: unknown key {key!r}", field="unique_opts", limit=_KEYS_LIMIT
            )
    by_queue = opts.get("by_queue", False)
    by_args = opts.get("by_args", True)
    for name, val in (("by_queue", by_queue), ("by_args", by_args)):
        if not isinstance(val, bool):
            raise ValidationError(
                f"unique_opts.{name} must be a bool, got {type(val).__name__}",
                field=f"unique_opts.{name}",
                limit="bool",
            )
    by_period = opts.get("by_period")
    if by_period is not None:
        if not _is_int(by_period):
            raise ValidationError(
                f"unique_opts.by_period must be None or an int, got {type(by_period).__name__}",
                field="unique_opts.by_period",
                limit="None or signed 64-bit int",
            )
        if not _INT64_MIN <= by_period <= _INT64_MAX:
            raise ValidationError(
                f"unique_opts.by_period must fit a signed 64-bit int, got {by_period}",
                field="unique_opts.by_period",
                limit="None or signed 64-bit int",
            )
    states = opts.get("states", DEFAULT_STATES)
    if not _is_int(states):
        raise ValidationError(
            f"unique_opts.states must be an int bitmask 0..255, got {type(states).__name__}",
            field="unique_opts.states",
            limit="0..255",
        )
    if not 0 <= states <= 255:
        raise ValidationError(
            f"unique_opts.states must be between 0 and 255, got {states}",
            field="unique_opts.states",
            limit="0..255",
        )
    return (by_queue, by_args, by_period, states)


def unique_key(kind, queue, args_json, by_queue, by_args, by_period):
    if not isinstance(kind, str) or not isinstance(queue, str):
        raise TypeError("kind and queue must be str")
    parts = [kind.encode("utf-8")]
    if by_queue:
        parts.append(b"\x00" + queue.encode("utf-8"))
    if by_args:
        if not isinstance(args_json, bytes):
            raise TypeError(f"args_json must be bytes, got {type(args_json).__name__}")
        parts.append(b"\x00" + args_json)
    if by_period is not None:
        if not isinstance(by_period, int):
            raise TypeError(f"by_period must be None or int, got {type(by_period).__name__}")
        parts.append(b"\x00" + int(by_period).to_bytes(8, "little", signed=True))
    return blake3(b"".join(parts)).digest()[:16]


# --------------------------------------------------------------------------- sizing


def _utf8_len(s, what):
    if not isinstance(s, str):
        raise TypeError(f"{what} must be str, got {type(s).__name__}")
    return len(s.encode("utf-8"))


def _bytes_len(b, what):
    if not isinstance(b, bytes):
        raise TypeError(f"{what} must be bytes, got {type(b).__name__}")
    return len(b)


def request_size(kind, queue, args_json, metadata_json, tags, ordering_key):
    total = _utf8_len(kind, "kind") + _utf8_len(queue, "queue")
    total += _bytes_len(args_json, "args_json") + _bytes_len(metadata_json, "metadata_json")
    total += sum(_utf8_len(tag, "tag") for tag in tags)
    if ordering_key is not None:
        total += _bytes_len(ordering_key, "ordering_key")
    return total


def _as_int64(value):
    n = operator.index(value)
    if not _INT64_MIN <= n <= _INT64_MAX:
        raise OverflowError("Python int too large to convert to C long")
    return n


class StagingBudget:
    def __init__(self, max_count=16, max_bytes=65536):
        mc = _as_int64(max_count)
        mb = _as_int64(max_bytes)
        if mc < 0:
            raise ValueError(f"max_count must be >= 0, got {mc}")
        if mb < 0:
            raise ValueError(f"max_bytes must be >= 0, got {mb}")
        self._max_count = mc
        self._max_bytes = mb
        self._count = 0
        self._bytes_used = 0

    count = property(lambda self: self._count)
    bytes_used = property(lambda self: self._bytes_used)
    max_count = property(lambda self: self._max_count)
    max_bytes = property(lambda self: self._max_bytes)

    def charge(self, size):
        n = _as_int64(size)
        if n < 0:
            raise ValueError(f"size must be >= 0, got {n}")
        if self._count + 1 > self._max_count:
            raise StagingError(
                f"ADR-046: at most {self._max_count} staged follow-ups per attempt",
                reason="too_many",
                limit=self._max_count,
            )
        if self._bytes_used + n > self._max_bytes:
            raise StagingError(
                f"ADR-046: at most {self._max_bytes} bytes of staged follow-ups per attempt, "
                f"this request would make {self._bytes_used + n}",
                reason="too_large",
                limit=self._max_bytes,
            )
        self._count += 1
        self._bytes_used += n


# ----------------------------------------------------------------------------- batch


def encode_many(objs, field):
    import orjson

    from awa_fast.errors import SerializationError

    out = []
    for i, obj in enumerate(objs):
        try:
            data = orjson.dumps(obj, option=orjson.OPT_SORT_KEYS)
        except TypeError as exc:
            raise SerializationError(
                f"{field}[{i}] is not JSON-serializable: {exc}", field=f"{field}[{i}]", limit="JSON"
            ) from exc
        check_json_nul(data, f"{field}[{i}]")
        out.append(data)
    return out


def keys_many(kind, queue, jsons, by_queue, by_args, by_period):
    return [unique_key(kind, queue, j, by_queue, by_args, by_period) for j in jsons]


def _copy_escape(data: bytes) -> bytes:
    return (
        data.replace(b"\\", b"\\\\")
        .replace(b"\t", b"\\t")
        .replace(b"\n", b"\\n")
        .replace(b"\r", b"\\r")
    )


def copy_block(ids, jsons, keys, head, mid, tail):
    if len(jsons) != len(ids) or (keys is not None and len(keys) != len(ids)):
        raise ValueError("ids, jsons and keys must have the same length")
    rows = []
    for i, job_id in enumerate(ids):
        key = b"\\N" if keys is None else b"\\\\x" + keys[i].hex().encode()
        rows.append(
            b"\t".join([str(job_id).encode(), head, _copy_escape(jsons[i]), mid, key, tail]) + b"\n"
        )
    return b"".join(rows)
