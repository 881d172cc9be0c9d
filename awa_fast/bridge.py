"""Insert a job through the caller's own connection, inside the caller's transaction (awa-pg's
``awa.bridge``): the job exists if and only if the caller commits.

Drivers, detected from the connection's type:
- psycopg 3 ``AsyncConnection`` / ``Connection``;
- asyncpg ``Connection`` (or a pool's connection proxy);
- SQLAlchemy ``Connection`` / ``Session`` (sync) and ``AsyncConnection`` / ``AsyncSession``
  (async), on any PostgreSQL dialect (psycopg, psycopg2, asyncpg);
- a Django database connection (``django.db.connection``, PostgreSQL backend).

Async connections go to :func:`insert_job`, sync ones to :func:`insert_job_sync`. Same rules
and errors as ``AsyncClient.insert`` (awa-fast also accepts ``unique_opts`` here, awa-pg does
not); the result is the job as a dict (``Job.to_dict()``: timestamps as RFC 3339 strings,
``unique_key`` as hex). A job that holds a unique key needs the caller's transaction at READ
COMMITTED: at REPEATABLE READ or SERIALIZABLE its insert is refused (migration 024) with
``DatabaseError`` (SQLSTATE 0A000). Driver errors are mapped by ``awa_fast.db_errors``, as for
the client's calls. ``schema=`` names the schema the job goes to (default: ``$AWA_FAST_SCHEMA``,
else ``awa_fast``; ADR 027): the statement is rewritten for it, the caller's connection is used
as it is.
"""

from __future__ import annotations

from typing import Any

import orjson
import psycopg

from awa_fast import db_errors, enqueue, sql
from awa_fast.job import JOB_FIELDS
from awa_fast.requests import prepare
from awa_fast.schema_binding import resolve


def _kind_from_dict(args: Any, kind: str | None) -> str | None:
    # awa's bridge also takes the kind from a dict's "kind" key.
    if kind is None and isinstance(args, dict) and isinstance(args.get("kind"), str):
        return args["kind"]
    return kind


def _driver(conn: Any) -> str:
    if isinstance(conn, psycopg.AsyncConnection):
        return "psycopg_async"
    if isinstance(conn, psycopg.Connection):
        return "psycopg_sync"
    module, name = type(conn).__module__ or "", type(conn).__name__
    if module.startswith("asyncpg"):
        return "asyncpg"
    if module.startswith("sqlalchemy"):
        return "sqlalchemy_async" if name.startswith("Async") else "sqlalchemy_sync"
    if module.startswith("django") and getattr(conn, "vendor", None) == "postgresql":
        return "django"
    raise TypeError(
        f"Unsupported connection type {type(conn).__qualname__} ({module}): "
        "awa_fast.bridge takes psycopg 3, asyncpg, SQLAlchemy (Connection, Session, "
        "async or not) and Django PostgreSQL connections"
    )


def _job_dict(text: str) -> dict:
    row = orjson.loads(text)
    out = {name: row.get(name) for name in JOB_FIELDS}
    key = out["unique_key"]
    if isinstance(key, str) and key.startswith("\\x"):
        out["unique_key"] = key[2:]
    return out


def _sqlalchemy_query(conn: Any) -> str:
    style = getattr(conn.dialect, "paramstyle", "format")
    if style in ("format", "pyformat"):
        return sql.BRIDGE_INSERT
    if style == "numeric_dollar":
        return sql.BRIDGE_INSERT_DOLLAR
    raise TypeError(f"SQLAlchemy paramstyle {style!r} is not supported by awa_fast.bridge")


@db_errors.maps("insert_job")
async def insert_job(
    conn: Any, args: Any, *, kind: str | None = None, schema: str | None = None, **opts: Any
) -> dict:
    """Insert on an async connection (psycopg ``AsyncConnection``, asyncpg, SQLAlchemy
    ``AsyncConnection``/``AsyncSession``) inside its current transaction, into ``schema``
    (see the module docstring); returns the job.

    Raises:
        ValidationError: bad input or ``schema`` name, checked before anything is sent (nothing
            is written).
        UniqueConflict: ``unique_opts`` given and the key is held.
        ReadOnlyDatabase, DatabaseUnavailable, DatabaseError: the driver reported another
            database error, mapped by SQLSTATE (``awa_fast.db_errors``; chained).
        TypeError: not an async connection of a supported driver (use insert_job_sync).
    """
    driver = _driver(conn)
    if driver not in ("psycopg_async", "asyncpg", "sqlalchemy_async"):
        raise TypeError(
            f"insert_job needs an async connection; use insert_job_sync for "
            f"{type(conn).__qualname__}"
        )
    binding = resolve(schema)
    p = prepare(args, kind=_kind_from_dict(args, kind), **opts)
    if driver == "psycopg_async":
        return (await enqueue.insert_one(conn, p, binding=binding)).to_dict()
    params = enqueue.one_params(p)
    if driver == "asyncpg":
        text = await conn.fetchval(binding.rewrite(sql.BRIDGE_INSERT_DOLLAR), *params)
    else:
        if hasattr(conn, "exec_driver_sql"):
            target = conn
        else:  # AsyncSession: its connection, inside the session's transaction
            target = await conn.connection()
        query = binding.rewrite(_sqlalchemy_query(target))
        result = await target.exec_driver_sql(query, params)
        text = result.scalar_one()
    return _job_dict(text)


@db_errors.maps("insert_job_sync")
def insert_job_sync(
    conn: Any, args: Any, *, kind: str | None = None, schema: str | None = None, **opts: Any
) -> dict:
    """Blocking twin of :func:`insert_job` for psycopg ``Connection``, SQLAlchemy
    ``Connection``/``Session`` and Django connections. Raises as :func:`insert_job`
    (TypeError for an async connection)."""
    driver = _driver(conn)
    if driver not in ("psycopg_sync", "sqlalchemy_sync", "django"):
        raise TypeError(
            f"insert_job_sync needs a sync connection; use insert_job for {type(conn).__qualname__}"
        )
    binding = resolve(schema)
    p = prepare(args, kind=_kind_from_dict(args, kind), **opts)
    if driver == "psycopg_sync":
        return enqueue.insert_one_sync(conn, p, binding=binding).to_dict()
    params = enqueue.one_params(p)
    if driver == "django":
        with conn.cursor() as cur:
            cur.execute(binding.rewrite(sql.BRIDGE_INSERT), params)
            text = cur.fetchone()[0]
    else:
        target = conn if hasattr(conn, "exec_driver_sql") else conn.connection()
        query = binding.rewrite(_sqlalchemy_query(target))
        text = target.exec_driver_sql(query, params).scalar_one()
    return _job_dict(text)
