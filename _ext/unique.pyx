# cython: language_level=3
"""Unique-job options and key hashing (compiled hot path).

Pure-Python twin: ``tests/reference_ext.py``.

Rule source: awa's unique-job semantics (``UniqueOpts``: by_queue, by_args,
by_period, states bitmask over the job states; default states 31 =
scheduled|available|running|completed|retryable).
"""

from libc.stdint cimport int64_t, uint64_t
from libc.string cimport memcpy
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING, PyBytes_GET_SIZE

from blake3 import blake3

from awa_fast.errors import ValidationError

cdef extern from "Python.h":
    const char* PyUnicode_AsUTF8AndSize(object s, Py_ssize_t* size) except NULL

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

_KEYS = ("by_queue", "by_args", "by_period", "states")
_KEYS_LIMIT = "dict with keys by_queue, by_args, by_period, states"
_INT64_MIN = -(2 ** 63)
_INT64_MAX = 2 ** 63 - 1


cdef inline bint _is_int(object v):
    return isinstance(v, int) and not isinstance(v, bool)


def parse_unique_opts(opts):
    """Validate unique-job options and return them as a tuple.

    Args:
        opts: ``None`` or a ``dict`` with only these keys:
            ``by_queue`` (``bool``, default ``False``),
            ``by_args`` (``bool``, default ``True``),
            ``by_period`` (``None`` or ``int`` fitting signed 64 bits, default
            ``None``; ``bool`` rejected),
            ``states`` (``int`` bitmask 0..255, default 31; ``bool`` rejected;
            bit positions in ``STATE_BITS``).

    Returns:
        ``None`` for ``None``, else ``(by_queue, by_args, by_period, states)``.

    Raises:
        awa_fast.errors.ValidationError: ``field="unique_opts"`` when ``opts``
            is not a dict or has an unknown key (checked first, in dict order);
            otherwise ``field="unique_opts.<key>"`` for the first bad key in
            the order by_queue, by_args, by_period, states, with ``limit`` one
            of "bool", "None or signed 64-bit int", "0..255".

    Rule source: awa ``UniqueOpts``.
    """
    if opts is None:
        return None
    if not isinstance(opts, dict):
        raise ValidationError(
            f"unique_opts must be a dict, got {type(opts).__name__}",
            field="unique_opts",
            limit=_KEYS_LIMIT,
        )
    for key in opts:
        if key not in _KEYS:
            raise ValidationError(
                f"unique_opts: unknown key {key!r}",
                field="unique_opts",
                limit=_KEYS_LIMIT,
            )
    by_queue = opts.get("by_queue", False)
    if not isinstance(by_queue, bool):
        raise ValidationError(
            f"unique_opts.by_queue must be a bool, got {type(by_queue).__name__}",
            field="unique_opts.by_queue",
            limit="bool",
        )
    by_args = opts.get("by_args", True)
    if not isinstance(by_args, bool):
        raise ValidationError(
            f"unique_opts.by_args must be a bool, got {type(by_args).__name__}",
            field="unique_opts.by_args",
            limit="bool",
        )
    by_period = opts.get("by_period", None)
    if by_period is not None:
        if not _is_int(by_period):
            raise ValidationError(
                f"unique_opts.by_period must be None or an int, got {type(by_period).__name__}",
                field="unique_opts.by_period",
                limit="None or signed 64-bit int",
            )
        if not (_INT64_MIN <= by_period <= _INT64_MAX):
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
    if not (0 <= states <= 255):
        raise ValidationError(
            f"unique_opts.states must be between 0 and 255, got {states}",
            field="unique_opts.states",
            limit="0..255",
        )
    return (by_queue, by_args, by_period, states)


def unique_key(str kind not None, str queue not None, args_json, bint by_queue, bint by_args, by_period):
    """Compute the 16-byte unique key of a job.

    Args:
        kind: ``str`` (hashed as UTF-8 bytes).
        queue: ``str`` (hashed as UTF-8 bytes, only if ``by_queue``).
        args_json: ``bytes``, canonical JSON (orjson with ``OPT_SORT_KEYS``);
            only read (and only required to be ``bytes``) if ``by_args``.
        by_queue: truthy to include the queue.
        by_args: truthy to include the args.
        by_period: ``None`` or ``int`` (period bucket), included as 8-byte
            little-endian signed int64.

    Returns:
        ``bytes`` of length 16: the first 16 bytes of BLAKE3 over
        ``kind [0x00 queue] [0x00 args_json] [0x00 int64le(by_period)]``.

    Raises:
        TypeError: ``kind``/``queue`` not ``str``, ``args_json`` not ``bytes``
            when ``by_args``, ``by_period`` not an integer.
        OverflowError: ``by_period`` outside signed 64 bits.
        UnicodeEncodeError: ``kind``/``queue`` with lone surrogates.

    Rule source: awa-fast unique-key layout (awa ``UniqueOpts``).
    """
    cdef const char* kp
    cdef const char* qp = NULL
    cdef const char* ap = NULL
    cdef Py_ssize_t kn, qn = 0, an = 0, total, pos
    cdef int64_t period = 0
    cdef uint64_t up
    cdef bint has_period = by_period is not None
    cdef int j
    cdef bytes buf
    cdef char* out

    kp = PyUnicode_AsUTF8AndSize(kind, &kn)
    total = kn
    if by_queue:
        qp = PyUnicode_AsUTF8AndSize(queue, &qn)
        total += 1 + qn
    if by_args:
        if not isinstance(args_json, bytes):
            raise TypeError(f"args_json must be bytes, got {type(args_json).__name__}")
        ap = PyBytes_AS_STRING(args_json)
        an = PyBytes_GET_SIZE(args_json)
        total += 1 + an
    if has_period:
        if not isinstance(by_period, int):
            raise TypeError(f"by_period must be None or int, got {type(by_period).__name__}")
        period = by_period
        total += 9

    buf = PyBytes_FromStringAndSize(NULL, total)
    out = PyBytes_AS_STRING(buf)
    memcpy(out, kp, kn)
    pos = kn
    if by_queue:
        out[pos] = 0
        memcpy(out + pos + 1, qp, qn)
        pos += 1 + qn
    if by_args:
        out[pos] = 0
        memcpy(out + pos + 1, ap, an)
        pos += 1 + an
    if has_period:
        out[pos] = 0
        pos += 1
        up = <uint64_t> period
        for j in range(8):
            out[pos + j] = <char> ((up >> (8 * j)) & 0xFF)
        pos += 8
    return blake3(buf).digest(length=16)
