"""Which connection mode a deployment runs in (the ``pooler`` setting, ADR 028), and the checks
that refuse a mode the connection does not match.

``None`` (the default): ``database_url`` reaches PostgreSQL directly; a connection pooler
found between them is an error (it could not be told whether it pools by session or by
transaction, and guessing wrong leaves a worker half working). ``"session"``: a pooler that
gives each client connection one server connection for its lifetime (PgBouncer
``pool_mode=session``): everything works as direct. ``"transaction"``: a pooler that may give
each transaction another server connection (PgBouncer ``pool_mode=transaction``, most managed
offerings' poolers): awa-fast keeps no session state on those connections: no server-side
prepared statements, no session ``SET``, no ``LISTEN`` (wake-ups from ``listen_url`` or by
polling), leadership by the lease row instead of a session advisory lock.

A pooler is recognised by the backend pid: PgBouncer gives its clients a pid and cancel key of
its own at connect, so the pid the connection announced differs from ``pg_backend_pid()``.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import psycopg

from awa_fast import sql
from awa_fast.errors import ConfigError

MODES = (None, "session", "transaction")
# The mode of a client given no ``pooler=`` (the CLI's, the dashboard's, an application's that
# leaves it to the deployment): "session" or "transaction"; unset or empty = direct.
ENV = "AWA_FAST_POOLER"


def from_env() -> str | None:
    """``$AWA_FAST_POOLER`` as a mode (``None`` when unset or empty).

    Raises:
        ConfigError: any other value than ``session`` or ``transaction`` (field
            ``AWA_FAST_POOLER``).
    """
    value = os.environ.get(ENV) or None
    if value not in MODES:
        raise ConfigError(
            f"${ENV}={value!r}: must be 'session' or 'transaction' (or unset: direct)",
            field=ENV,
            limit="'session' or 'transaction'",
        )
    return value


def check_setting(pooler: Any, listen_url: Any = None) -> str | None:
    """``pooler`` if it is one of :data:`MODES`.

    Raises:
        ConfigError: ``pooler`` is not ``None``, ``"session"`` or ``"transaction"``
            (field ``pooler``); ``listen_url`` is given but not a non-empty str
            (field ``listen_url``).
    """
    if pooler not in MODES or isinstance(pooler, bool):
        raise ConfigError(
            f"pooler={pooler!r}: must be None (a direct connection), 'session' or "
            "'transaction' (the pooler's pool mode)",
            field="pooler",
            limit="None, 'session' or 'transaction'",
        )
    if listen_url is not None and (not isinstance(listen_url, str) or not listen_url):
        raise ConfigError(
            f"listen_url={listen_url!r}: must be a libpq connection string or URI",
            field="listen_url",
            limit="a non-empty str",
        )
    return pooler


def session_state_allowed(pooler: str | None) -> bool:
    """Whether a connection of this mode may carry session state (``SET``, ``LISTEN``, a
    session advisory lock, named prepared statements): not through a transaction pooler."""
    return pooler != "transaction"


def connect_options(pooler: str | None) -> dict[str, Any]:
    """The psycopg connect keywords every connection of this mode gets: through a transaction
    pooler no prepared statements (psycopg's named ones would meet another client's of the
    same name on a shared server connection: ``DuplicatePreparedStatement``)."""
    return {} if session_state_allowed(pooler) else {"prepare_threshold": None}


async def pooled(conn: psycopg.AsyncConnection) -> bool:
    """Whether ``conn`` goes through a connection pooler (its announced backend pid is not the
    server's)."""
    cur = await conn.execute(sql.BACKEND_PID)
    row = await cur.fetchone()
    return row is None or row[0] != conn.info.backend_pid


async def check_connection(
    conn: psycopg.AsyncConnection, pooler: str | None, url: str | None = None
) -> None:
    """Refuse a ``database_url`` connection that does not match ``pooler`` (at pool open and
    at ``start()``: before anything is written). ``url`` (``conn``'s) lets a declared
    ``"session"`` pooler be tested with a second client connection.

    Raises:
        ConfigError: field ``pooler``: ``pooler`` is ``None`` but the connection goes through a
            pooler; or ``pooler="session"`` but the pooler hands a second client connection
            the server connection ``conn`` just used (it pools by transaction); or
            ``pooler="transaction"`` and the database's (role's)
            ``default_transaction_isolation`` is not ``read committed`` (a session ``SET``
            cannot fix it through such a pooler, and keyed inserts need it: migration 024).
    """
    if pooler is None and await pooled(conn):
        raise ConfigError(
            "database_url goes through a connection pooler (the backend pid the connection "
            "announced is not the server's), but pooler is not set: set pooler='transaction' "
            "(PgBouncer pool_mode=transaction, most managed poolers) or pooler='session'",
            field="pooler",
            limit="'session' or 'transaction' behind a pooler",
        )
    if pooler == "session" and url is not None:
        await _check_session_pooling(conn, url)
    if pooler == "transaction":
        cur = await conn.execute(sql.DEFAULT_ISOLATION)
        row = await cur.fetchone()
        if row is None or row[0] != "read committed":
            raise ConfigError(
                f"pooler='transaction': the database's default_transaction_isolation is "
                f"{row and row[0]!r}, and a session SET does not survive a transaction pooler; "
                "keyed inserts need 'read committed' (ALTER ROLE ... SET "
                "default_transaction_isolation = 'read committed')",
                field="pooler",
                limit="default_transaction_isolation = 'read committed'",
            )


async def check_listen_url(listen_url: str) -> None:
    """Refuse a ``listen_url`` that does not reach PostgreSQL directly (``LISTEN`` through a
    transaction pooler receives nothing).

    Raises:
        ConfigError: field ``listen_url``: it goes through a pooler, or cannot be connected to
            within 10 s.
    """
    try:
        conn = await psycopg.AsyncConnection.connect(
            listen_url, autocommit=True, connect_timeout=10
        )
    except psycopg.Error as exc:
        raise ConfigError(
            f"listen_url: cannot connect: {exc}", field="listen_url", limit="reachable"
        ) from exc
    try:
        if await pooled(conn):
            raise ConfigError(
                "listen_url goes through a connection pooler (the backend pid the connection "
                "announced is not the server's): LISTEN needs a direct connection to PostgreSQL",
                field="listen_url",
                limit="a direct connection",
            )
    finally:
        await conn.close()


# Seconds a declared session pooler's second client connection may wait for its server
# connection: a session pooler with every server connection taken queues it, which proves
# nothing either way.
SESSION_PROBE_S = 3.0


async def _check_session_pooling(conn: psycopg.AsyncConnection, url: str) -> None:
    # A session pooler keeps conn's server connection conn's while conn is connected; a
    # transaction pooler gives it (idle again after conn's statement) to the next client.
    # The same pid twice proves transaction pooling; different pids do not prove session
    # pooling (another idle server connection may be handed out), so this refuses only the
    # former.
    cur = await conn.execute(sql.BACKEND_PID)
    row = await cur.fetchone()
    try:
        async with asyncio.timeout(SESSION_PROBE_S):
            other = await psycopg.AsyncConnection.connect(
                url, autocommit=True, prepare_threshold=None, connect_timeout=10
            )
            try:
                cur = await other.execute(sql.BACKEND_PID)
                other_row = await cur.fetchone()
            finally:
                await other.close()
    except (TimeoutError, psycopg.Error):
        return  # no answer in time or no connection: nothing learnt
    if row is not None and other_row == row:
        raise ConfigError(
            "pooler='session', but the pooler handed a second client connection the same "
            f"server connection (backend pid {row[0]}) while the first was still connected: "
            "it pools by transaction; set pooler='transaction' (or pool_mode=session)",
            field="pooler",
            limit="pooler='transaction' behind a transaction pooler",
        )
