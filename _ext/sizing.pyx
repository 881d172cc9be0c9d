# cython: language_level=3
"""Request size accounting and the per-attempt staging budget (compiled hot path).

Pure-Python twin: ``tests/reference_ext.py``.

Rule source: ADR-046 (handler-staged follow-ups): at most 16 staged
follow-ups and at most 65536 bytes of them per attempt.
"""

from cpython.bytes cimport PyBytes_GET_SIZE
from cpython.number cimport PyNumber_Index

from awa_fast.errors import StagingError

cdef extern from "Python.h":
    const char* PyUnicode_AsUTF8AndSize(object s, Py_ssize_t* size) except NULL


cdef inline Py_ssize_t _utf8_len(object s, str what) except -1:
    cdef Py_ssize_t n
    if not isinstance(s, str):
        raise TypeError(f"{what} must be str, got {type(s).__name__}")
    PyUnicode_AsUTF8AndSize(s, &n)
    return n


cdef inline Py_ssize_t _bytes_len(object b, str what) except -1:
    if not isinstance(b, bytes):
        raise TypeError(f"{what} must be bytes, got {type(b).__name__}")
    return PyBytes_GET_SIZE(b)


cdef inline long long _as_int64(object value) except? -1:
    # PyNumber_Index rejects float/str (TypeError) but takes int and bool;
    # the C conversion then raises OverflowError outside signed 64 bits.
    return PyNumber_Index(value)


def request_size(kind, queue, args_json, metadata_json, tags, ordering_key):
    """Size of one insert request in bytes, as charged against the staging budget.

    Args:
        kind: ``str``, counted as UTF-8 bytes.
        queue: ``str``, counted as UTF-8 bytes.
        args_json: ``bytes`` (encoded JSON), counted as is.
        metadata_json: ``bytes`` (encoded JSON), counted as is.
        tags: iterable (normally ``list``) of ``str``, each counted as UTF-8 bytes.
        ordering_key: ``bytes`` or ``None`` (counts 0).

    Returns:
        ``int``: total bytes (not characters).

    Raises:
        TypeError: an argument of the wrong type.
        UnicodeEncodeError: a str with lone surrogates.

    Rule source: ADR-046 (the 65536-byte budget is measured with this sum).
    """
    cdef Py_ssize_t total = 0
    cdef Py_ssize_t i, n
    cdef list tag_list
    total += _utf8_len(kind, "kind")
    total += _utf8_len(queue, "queue")
    total += _bytes_len(args_json, "args_json")
    total += _bytes_len(metadata_json, "metadata_json")
    if type(tags) is list:
        tag_list = <list>tags
        n = len(tag_list)
        for i in range(n):
            total += _utf8_len(tag_list[i], "tag")
    else:
        for tag in tags:
            total += _utf8_len(tag, "tag")
    if ordering_key is not None:
        total += _bytes_len(ordering_key, "ordering_key")
    return total


cdef class StagingBudget:
    """Per-attempt budget for staged follow-ups (ADR-046).

    Args:
        max_count: ``int`` >= 0, maximum number of staged follow-ups (default 16).
        max_bytes: ``int`` >= 0, maximum total bytes of staged follow-ups, as
            measured by :func:`request_size` (default 65536).

    Raises:
        ValueError: a negative limit. OverflowError: a limit outside signed 64 bits.
        TypeError: a non-integer limit.

    Read-only properties: ``count``, ``bytes_used``, ``max_count``, ``max_bytes``.
    """

    cdef readonly long long count
    cdef readonly long long bytes_used
    cdef readonly long long max_count
    cdef readonly long long max_bytes

    def __init__(self, max_count=16, max_bytes=65536):
        cdef long long mc = _as_int64(max_count)
        cdef long long mb = _as_int64(max_bytes)
        if mc < 0:
            raise ValueError(f"max_count must be >= 0, got {mc}")
        if mb < 0:
            raise ValueError(f"max_bytes must be >= 0, got {mb}")
        self.max_count = mc
        self.max_bytes = mb
        self.count = 0
        self.bytes_used = 0

    def charge(self, size):
        """Charge one staged follow-up of ``size`` bytes against the budget.

        Args:
            size: ``int`` >= 0, the request's size in bytes (see
                :func:`request_size`).

        Returns:
            ``None``; ``count`` grows by 1 and ``bytes_used`` by ``size``.

        Raises:
            awa_fast.errors.StagingError(reason="too_many", limit=max_count):
                if ``count + 1 > max_count`` (checked first).
            awa_fast.errors.StagingError(reason="too_large", limit=max_bytes):
                if ``bytes_used + size > max_bytes``.
            ValueError: negative ``size``. OverflowError: ``size`` outside
                signed 64 bits. TypeError: non-integer ``size``.

            A failed charge changes nothing.

        Rule source: ADR-046.
        """
        cdef long long n = _as_int64(size)
        if n < 0:
            raise ValueError(f"size must be >= 0, got {n}")
        if self.count >= self.max_count:
            raise StagingError(
                f"ADR-046: at most {self.max_count} staged follow-ups per attempt",
                reason="too_many",
                limit=self.max_count,
            )
        # Compare without overflow: 0 <= bytes_used <= max_bytes always holds.
        if n > self.max_bytes - self.bytes_used:
            raise StagingError(
                f"ADR-046: at most {self.max_bytes} bytes of staged follow-ups per attempt, "
                f"this request would make {<object>self.bytes_used + <object>n}",
                reason="too_large",
                limit=self.max_bytes,
            )
        self.count += 1
        self.bytes_used += n

