"""Which errors a retry can cure: the one classification of every error the finalizer, the
heartbeat and the maintenance loops (and ``bulk.run_isolated``) meet.

:func:`classify` sorts an exception by what can succeed if the same work is tried again:

* ``TRANSIENT`` -- the same statement can succeed on a retry: a lost or refused connection
  (SQLSTATE class 08, libpq's own connection errors, ``OSError``, a pool that gave no connection
  in time), a deadlock or serialization failure (40001, 40P01, 40003), a lock or statement
  timeout (55, 57014), the server shutting down or starting (57P01-57P03), exhausted resources
  (53: out of memory, out of shared memory, too many connections, disk full), a session timed
  out idle in a transaction (25P03), a write refused as read-only (25006: the connection reached
  a standby or a primary fenced for a switchover; the connection is dropped, and the next one
  libpq opens on a multi-host URL with ``target_session_attrs=read-write`` reaches the writable
  server: awa_fast/primary.py).
* ``ROW`` -- the statement's data: the same statement fails the same way, but its rows tried
  alone may succeed (constraints, triggers, data errors, program limits such as a value too
  large to store (54), class 42 -- a trigger may raise it for one row --, and any non-database
  exception: a bug meets the same input the same way).
* ``BLOCKED`` -- every statement fails until an operator acts: an invalid transaction state
  (class 25 but 25006 and 25P03), a feature the server lacks (0A), a server-side file or I/O
  error (58), a database being dropped (57P04). A loop that runs forever may try again on its
  slow clock; a bounded retry is wasted.
* ``CLOSED`` -- this process closed what the work needs (``psycopg_pool.PoolClosed``, a closed
  connection's ``psycopg.InterfaceError``): nothing succeeds again; stop.

An awa-fast ``DatabaseError`` (the typed wrapper of a driver error) is classified by its
cause; awa-fast's ``DeadlockError`` (retries already spent) is ``TRANSIENT``.
"""

from __future__ import annotations

import enum

import psycopg
import psycopg_pool

from awa_fast import errors


class Retry(enum.Enum):
    TRANSIENT = "transient"
    ROW = "row"
    BLOCKED = "blocked"
    CLOSED = "closed"


_TRANSIENT_STATES = (
    *("08", "40001", "40P01", "40003", "53", "55"),
    *("57014", "57P01", "57P02", "57P03", "57000", "25P03", "25006"),
)
_BLOCKED_STATES = ("25", "0A", "58", "57P04")


def classify(exc: BaseException) -> Retry:
    """The :class:`Retry` class of ``exc`` (module docstring: the classes and their rules).

    Args:
        exc: any exception a database call raised.

    Returns:
        :class:`Retry`; never raises.
    """
    if isinstance(exc, errors.DeadlockError):
        return Retry.TRANSIENT
    if isinstance(exc, errors.DatabaseError) and isinstance(exc.__cause__, Exception):
        return classify(exc.__cause__)
    if isinstance(exc, psycopg_pool.PoolClosed) or isinstance(exc, psycopg.InterfaceError):
        return Retry.CLOSED
    if isinstance(exc, psycopg_pool.PoolTimeout):
        return Retry.TRANSIENT
    if isinstance(exc, psycopg.Error):
        state = getattr(exc, "sqlstate", None) or ""
        if state.startswith(_TRANSIENT_STATES):
            return Retry.TRANSIENT
        if state.startswith(_BLOCKED_STATES):
            return Retry.BLOCKED
        if not state:  # libpq's own errors (connection failed or lost) carry no SQLSTATE
            return Retry.TRANSIENT if isinstance(exc, psycopg.OperationalError) else Retry.ROW
        return Retry.ROW
    if isinstance(exc, OSError):  # includes TimeoutError
        return Retry.TRANSIENT
    return Retry.ROW


def retryable(exc: BaseException) -> bool:
    """Whether the same work, tried again after a pause, can succeed (``TRANSIENT``)."""
    return classify(exc) is Retry.TRANSIENT
