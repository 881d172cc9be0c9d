"""Which server writes: a multi-host URL's rule, and how a connection learns that the server it
reached no longer takes writes (a failover or a switchover; docs/deployment.md, "Failover";
ADR 035).

libpq picks the server of each new connection: with several hosts (``host=a,b port=x,y``) and
``target_session_attrs=read-write`` (or ``primary``) it tries them in order and keeps the first
that accepts writes. A connection already open stays on its server: when that server dies, its
statements fail and the connection is replaced (the pool, the heartbeat's, the listener's and
the election's own each reconnect); when that server stays up but refuses writes (a standby
reached without the attribute, a primary fenced read-only for a switchover), only its answers
tell: a statement refused with SQLSTATE 25006 (``read_only_sql_transaction``), or the
``in_hot_standby`` / ``default_transaction_read_only`` values the server reports on every
connection (PostgreSQL 14 and later; no query). Where the URL asks libpq for a writable server
(:func:`wants_primary`; also with a single host name an HA manager moves), such a connection
is closed, so the next one is chosen by libpq again.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import psycopg
from psycopg.conninfo import conninfo_to_dict

from awa_fast.errors import ConfigError

#: target_session_attrs values that make libpq keep only a server that accepts writes.
WRITABLE_ATTRS = ("read-write", "primary")
#: SQLSTATE of a write refused by a read-only server or transaction.
READ_ONLY_SQLSTATE = "25006"
#: Times a client's insert refused as read-only is run again on a new connection.
READ_ONLY_RETRIES = 2

log = logging.getLogger("awa_fast.primary")
T = TypeVar("T")


def _params(url: str) -> dict[str, Any]:
    try:
        return conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return {}  # not parseable here: libpq reports it at the first connect


def wants_primary(url: str) -> bool:
    """Whether ``url`` (a libpq URI or key=value string) makes libpq keep only a server that
    accepts writes (``target_session_attrs`` ``read-write`` or ``primary``)."""
    return _params(url).get("target_session_attrs") in WRITABLE_ATTRS


def check_url(url: str, field: str) -> None:
    """Refuse a URL with several hosts that would let libpq keep a read-only one.

    Args:
        url: a libpq URI or key=value connection string.
        field: the setting it came from (``database_url``, ``listen_url``), for the error.

    Raises:
        ConfigError: ``url`` names several hosts (``host=a,b``, ``hostaddr=..,..`` or
            ``postgresql://a,b/db``) and its ``target_session_attrs`` is not ``read-write`` or
            ``primary``: libpq would keep the first host that answers, a standby included,
            and every write there would fail.
    """
    params = _params(url)
    hosts = max(len(str(params.get(k) or "").split(",")) for k in ("host", "hostaddr"))
    if hosts > 1 and params.get("target_session_attrs") not in WRITABLE_ATTRS:
        raise ConfigError(
            f"{field} names {hosts} hosts but target_session_attrs is "
            f"{params.get('target_session_attrs', 'any')!r}: libpq would keep the first host "
            "that answers, a standby included; add target_session_attrs=read-write",
            field=field,
            limit="target_session_attrs=read-write (or primary) with several hosts",
        )


def read_only_error(exc: BaseException) -> bool:
    """Whether ``exc`` is a write refused because the server (or transaction) is read-only
    (SQLSTATE 25006), looking through awa-fast's typed wrappers (``__cause__``)."""
    for _ in range(3):
        if getattr(exc, "sqlstate", None) == READ_ONLY_SQLSTATE:
            return True
        cause = exc.__cause__
        if cause is None:
            return False
        exc = cause
    return False


def server_read_only(conn: psycopg.AsyncConnection | psycopg.Connection) -> bool:
    """Whether the server of ``conn`` last reported that it takes no writes: a hot standby
    (``in_hot_standby``) or ``default_transaction_read_only = on``. No query: PostgreSQL 14 and
    later report both on every connection, and again when they change (a reload, a promotion),
    with the answer to the next statement. Older servers report neither: False."""
    if conn.closed:
        return False
    info = conn.info
    return (
        info.parameter_status("in_hot_standby") == "on"
        or info.parameter_status("default_transaction_read_only") == "on"
    )


async def retry_read_only(fn: Callable[[], Awaitable[T]], *, what: str) -> T:
    """Await ``fn()`` (a whole statement or transaction on a pooled connection); when the
    server refuses it as read-only -- nothing was written -- run it again, at most
    ``READ_ONLY_RETRIES`` more times: the pool closed that connection (``connections.Pool``),
    and the next one is chosen by libpq (the promoted primary of a multi-host URL).

    Raises:
        psycopg.errors.ReadOnlySqlTransaction: still refused after the retries (the caller's
            boundary raises it as ``ReadOnlyDatabase``).
    """
    for attempt in range(READ_ONLY_RETRIES + 1):
        try:
            return await fn()
        except psycopg.errors.ReadOnlySqlTransaction as exc:
            if attempt == READ_ONLY_RETRIES:
                raise
            log.info("%s: the server took no writes (%s); retry %d", what, exc, attempt + 1)
    raise AssertionError("unreachable")
