# cython: language_level=3
"""The per-row hot loops of bulk enqueue (COPY): canonical JSON + NUL scan, unique keys, and the
COPY text block. Moved here from Python after profiling insert_many_copy / enqueue_many_copy
(psycopg's per-row write_row and the per-row Python loops dominated)."""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE, PyBytes_FromStringAndSize

import orjson

from awa_fast._ext.unique import unique_key
from awa_fast._ext.validate import check_json_nul
from awa_fast.errors import SerializationError

cdef object _DUMPS = orjson.dumps
cdef int _SORT = orjson.OPT_SORT_KEYS
cdef const char* _HEX = b"0123456789abcdef"


def encode_many(list objs not None, str field not None):
    """Canonical JSON (orjson, sorted keys) of each element, each checked for NUL characters.

    Args:
        objs: ``list`` of JSON-compatible values.
        field: ``str`` field name for errors (``"args"``).

    Returns:
        ``list[bytes]``, one per element.

    Raises:
        SerializationError: element ``i`` does not serialize (``field`` is ``"args[i]"``).
        ValidationError: element ``i`` contains a NUL character (``field`` is ``"args[i]"``).
    """
    cdef Py_ssize_t i, n = len(objs)
    cdef list out = [None] * n
    for i in range(n):
        try:
            data = _DUMPS(objs[i], option=_SORT)
        except TypeError as exc:
            raise SerializationError(f"{field}[{i}] is not JSON-serializable: {exc}",
                                     field=f"{field}[{i}]", limit="JSON") from exc
        check_json_nul(data, f"{field}[{i}]")
        out[i] = data
    return out


def keys_many(str kind not None, str queue not None, list jsons not None, bint by_queue,
              bint by_args, by_period):
    """``unique_key`` of each args JSON in ``jsons`` (16 bytes each; see unique.unique_key)."""
    return [unique_key(kind, queue, j, by_queue, by_args, by_period) for j in jsons]


cdef inline Py_ssize_t _escaped_len(const unsigned char* p, Py_ssize_t n):
    cdef Py_ssize_t i, extra = 0
    for i in range(n):
        if p[i] == 92 or p[i] == 9 or p[i] == 10 or p[i] == 13:
            extra += 1
    return n + extra


cdef inline Py_ssize_t _put_escaped(char* out, Py_ssize_t pos, const unsigned char* p,
                                    Py_ssize_t n):
    # COPY text format: backslash, tab, newline and carriage return are escaped.
    cdef Py_ssize_t i
    cdef unsigned char c
    for i in range(n):
        c = p[i]
        if c == 92:
            out[pos] = 92; out[pos + 1] = 92; pos += 2
        elif c == 9:
            out[pos] = 92; out[pos + 1] = 116; pos += 2
        elif c == 10:
            out[pos] = 92; out[pos + 1] = 110; pos += 2
        elif c == 13:
            out[pos] = 92; out[pos + 1] = 114; pos += 2
        else:
            out[pos] = c; pos += 1
    return pos


def copy_block(list ids not None, list jsons not None, list keys, bytes head not None,
               bytes mid not None, bytes tail not None):
    """One COPY text-format block of rows ``id \\t head \\t args \\t mid \\t key \\t tail``.

    Args:
        ids: ``list[int]`` job ids.
        jsons: ``list[bytes]`` args JSON per row (escaped here).
        keys: ``list[bytes]`` 16-byte unique keys per row, or ``None`` (all ``\\N``).
        head, mid, tail: ``bytes``, already COPY-escaped constant columns, tab-separated.

    Returns:
        ``bytes``: the rows, each ending in a newline.
    """
    cdef Py_ssize_t n = len(ids), i, j, total = 0, pos = 0, an
    cdef bytes id_text, key
    cdef list id_texts = [None] * n
    cdef const unsigned char* ap
    cdef const unsigned char* kp
    cdef Py_ssize_t hn = PyBytes_GET_SIZE(head), mn = PyBytes_GET_SIZE(mid)
    cdef Py_ssize_t tn = PyBytes_GET_SIZE(tail)
    if len(jsons) != n or (keys is not None and len(keys) != n):
        raise ValueError("ids, jsons and keys must have the same length")
    for i in range(n):
        id_text = str(ids[i]).encode()
        id_texts[i] = id_text
        ap = <const unsigned char*> PyBytes_AS_STRING(jsons[i])
        total += (PyBytes_GET_SIZE(id_text) + hn + mn + tn + 6
                  + _escaped_len(ap, PyBytes_GET_SIZE(jsons[i])) + (35 if keys is not None else 2))
    result = PyBytes_FromStringAndSize(NULL, total)
    cdef char* out = PyBytes_AS_STRING(result)
    for i in range(n):
        id_text = id_texts[i]
        an = PyBytes_GET_SIZE(id_text)
        for j in range(an):
            out[pos + j] = PyBytes_AS_STRING(id_text)[j]
        pos += an
        out[pos] = 9; pos += 1
        for j in range(hn):
            out[pos + j] = PyBytes_AS_STRING(head)[j]
        pos += hn
        out[pos] = 9; pos += 1
        pos = _put_escaped(out, pos, <const unsigned char*> PyBytes_AS_STRING(jsons[i]),
                           PyBytes_GET_SIZE(jsons[i]))
        out[pos] = 9; pos += 1
        for j in range(mn):
            out[pos + j] = PyBytes_AS_STRING(mid)[j]
        pos += mn
        out[pos] = 9; pos += 1
        if keys is None:
            out[pos] = 92; out[pos + 1] = 78; pos += 2  # \N
        else:
            key = keys[i]
            kp = <const unsigned char*> PyBytes_AS_STRING(key)
            out[pos] = 92; out[pos + 1] = 92; out[pos + 2] = 120; pos += 3  # \\x
            for j in range(16):
                out[pos] = _HEX[kp[j] >> 4]; out[pos + 1] = _HEX[kp[j] & 15]; pos += 2
        out[pos] = 9; pos += 1
        for j in range(tn):
            out[pos + j] = PyBytes_AS_STRING(tail)[j]
        pos += tn
        out[pos] = 10; pos += 1
    return result[:pos] if pos != total else result
