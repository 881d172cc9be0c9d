"""Insert a job through the caller's own psycopg 3 connection (awa-pg's ``awa.bridge``).

The insert joins whatever transaction the caller has open on that connection, so the job exists
if and only if the caller commits. Same rules and errors as ``AsyncClient.insert``.
"""

from __future__ import annotations

from typing import Any

import psycopg

from awa_fast import enqueue
from awa_fast.requests import prepare


def _kind_from_dict(args: Any, kind: str | None) -> str | None:
    # awa's bridge also takes the kind from a dict's "kind" key.
    if kind is None and isinstance(args, dict) and isinstance(args.get("kind"), str):
        return args["kind"]
    return kind


async def insert_job(conn: psycopg.AsyncConnection, args: Any, *, kind: str | None = None,
                     **opts: Any) -> dict:
    """Insert on an async psycopg connection; returns the job as a dict.

    Raises:
        ValidationError: bad input (nothing is written).
        UniqueConflict: ``unique_opts`` given and the key is held.
        TypeError: ``conn`` is not a psycopg ``AsyncConnection``.
    """
    if not isinstance(conn, psycopg.AsyncConnection):
        raise TypeError("insert_job needs a psycopg.AsyncConnection (use insert_job_sync for sync)")
    p = prepare(args, kind=_kind_from_dict(args, kind), **opts)
    return (await enqueue.insert_one(conn, p)).to_dict()


def insert_job_sync(conn: psycopg.Connection, args: Any, *, kind: str | None = None,
                    **opts: Any) -> dict:
    """Blocking twin of :func:`insert_job` for a sync psycopg ``Connection``."""
    if not isinstance(conn, psycopg.Connection):
        raise TypeError("insert_job_sync needs a psycopg.Connection")
    p = prepare(args, kind=_kind_from_dict(args, kind), **opts)
    return enqueue.insert_one_sync(conn, p).to_dict()
