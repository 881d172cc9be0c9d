"""What each dashboard page shows, read with the bounded statements of ``awa_fast.sql.dashboard``.

Reads go through their own small pool: autocommit, no server-side prepared statements (so each
statement is planned with its actual parameter values, as the plan test checks) and a statement
timeout, so a slow page fails with a 503 instead of holding a connection. Both of the dashboard's
pools (this one and its client's) wait for the database as :func:`bounded` says.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row
from psycopg_pool import PoolTimeout

from awa_fast.connections import Pool
from awa_fast.pg_connection import connection_class
from awa_fast.schema_binding import DEFAULT, SchemaBinding
from awa_fast.sql import dashboard as q

STATEMENT_TIMEOUT_MS = q.STATEMENT_TIMEOUT_MS
# The longest a page waits for a database connection before it answers 503 (docs/dashboard.md).
DB_WAIT_S = 3.0
# The most connections each of the dashboard's pools opens (docs/dashboard.md): the reads' (every
# page) and the client's (actions, DLQ depth, cron). Pages that wait on the database (a lock,
# a slow query: each holds its connection up to the 5 s statement timeout) hold one each, so
# ten such pages at once still leave none waiting; one more waits DB_WAIT_S for a connection,
# then gets a 503 saying every connection is busy.
READ_CONNECTIONS = 10
CLIENT_CONNECTIONS = 4
# How long the dashboard's startup (the app's lifespan, ``awa-fast serve``) waits for the database
# to accept connections before it gives up (docs/dashboard.md).
STARTUP_S = 30.0
# At startup, how long one wait for a connection lasts before another connect is started: a
# refused connect fails at once and, with ``reconnect_timeout=0``, is not retried by the pool.
STARTUP_RETRY_S = 0.5
# libpq's connect_timeout (whole seconds, 2 at least): a connect into a network that drops its
# packets ends, and frees its place in the pool, in 2 s instead of psycopg's default 130 s.
CONNECT_TIMEOUT_S = 2
ACTIVE_STATES = (
    "available",
    "scheduled",
    "retryable",
    "running",
    "waiting_external",
    "consequence_pending",
)


def bounded(url: str, options: dict[str, Any]) -> dict[str, Any]:
    """psycopg_pool ``options`` of a pool on ``url``, made to hold a page to ``DB_WAIT_S``.

    A checkout waits at most ``DB_WAIT_S`` (then ``PoolTimeout``: the page's 503) and a connect
    ``CONNECT_TIMEOUT_S`` (unless the URL sets its own). A failed connect is retried once at once,
    then given up (``reconnect_timeout=0``) and the next page that needs a connection starts a
    fresh one: with psycopg_pool's backoff (1 s doubling, for up to 5 min) a pool that lost its
    connections could try again only minutes after the database was back.
    """
    kwargs = dict(options.get("kwargs") or {})
    if "connect_timeout" not in conninfo_to_dict(url):
        kwargs["connect_timeout"] = CONNECT_TIMEOUT_S
    return {**options, "kwargs": kwargs, "timeout": DB_WAIT_S, "reconnect_timeout": 0}


@dataclasses.dataclass
class Page:
    """One keyset page: its rows, the ids it examined ``[low, before)`` (at most the window
    ``[floor, before)``; less when the page filled up) and the ``before`` of the next (older)
    page, or ``None`` when nothing older exists."""

    rows: list[dict]
    before: int
    floor: int
    next_before: int | None
    windowed: bool = True

    @property
    def low(self) -> int:
        return self.rows[-1]["id"] if len(self.rows) == q.PAGE_ROWS else self.floor


class Reads:
    """The dashboard's read model over ``database_url`` (open with :meth:`open`), of the schema
    ``binding`` (default ``awa_fast``; ADR 027)."""

    def __init__(
        self,
        database_url: str,
        max_connections: int = READ_CONNECTIONS,
        *,
        binding: SchemaBinding = DEFAULT,
    ):
        self.binding = binding
        self._pool = Pool(
            database_url,
            open=False,
            **bounded(
                database_url,
                dict(
                    min_size=1,
                    max_size=max_connections,
                    kwargs={"autocommit": True, "prepare_threshold": None, "row_factory": dict_row},
                    connection_class=connection_class(binding),
                ),
            ),
        )

    async def open(self, timeout: float = STARTUP_S) -> None:
        """Open the pool and wait until it holds a connection, for up to ``timeout`` seconds:
        a connect that fails is followed by another (every ``STARTUP_RETRY_S`` at most), so a
        database that refuses connections for a while at startup is waited for.

        Raises:
            psycopg_pool.PoolTimeout: no connection within ``timeout`` (the pool stays open;
                :meth:`close` it).
        """
        deadline = time.monotonic() + timeout
        await self._pool.open(wait=False)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise PoolTimeout(f"no connection to the database within {timeout:g} s")
            try:
                # each wait that finds no connection starting starts one (the pool grows)
                conn = await self._pool.getconn(min(left, STARTUP_RETRY_S))
            except PoolTimeout:
                continue
            await self._pool.putconn(conn)
            return

    async def close(self) -> None:
        await self._pool.close()

    async def _all(self, query: str, params: dict | None = None) -> list[dict]:
        # The timeout is the transaction's own (SET LOCAL), never the session's: through a
        # transaction pooler a session SET stays on a server connection workers get next.
        async with self._pool.connection() as conn, conn.transaction():
            await conn.execute(q.SET_STATEMENT_TIMEOUT)
            cur = await conn.execute(query, params)
            return await cur.fetchall()

    async def _one(self, query: str, params: dict | None = None) -> dict | None:
        rows = await self._all(query, params)
        return rows[0] if rows else None

    async def _aggregate(self, query: str, params: dict | None = None) -> dict:
        # an aggregate returns exactly one row
        row = await self._one(query, params)
        if row is None:
            raise LookupError(f"an aggregate returned no row: {query.strip()[:60]!r}")
        return row

    # -- queues ----------------------------------------------------------------------------------

    async def queues(self, dlq_depth: dict[str, int]) -> list[dict]:
        """One dict per queue: active depth by state, oldest available run_at, recent outcomes
        (newest ``SAMPLE_IDS`` ids), paused flag and DLQ depth."""
        bounds = await self._aggregate(q.ID_BOUNDS)
        floor = (bounds["max"] or 0) - q.SAMPLE_IDS + 1
        out: dict[str, dict[str, Any]] = {}

        def row(name: str) -> dict[str, Any]:
            return out.setdefault(
                name,
                {
                    "queue": name,
                    "depth": dict.fromkeys(ACTIVE_STATES, 0),
                    "oldest": None,
                    "completed": 0,
                    "failed": 0,
                    "cancelled": 0,
                    "completed_5m": 0,
                    "paused": False,
                    "paused_at": None,
                    "paused_by": None,
                    "dlq": 0,
                },
            )

        for r in await self._all(q.QUEUE_DEPTH):
            entry = row(r["queue"])
            entry["depth"][r["state"]] = r["n"]
            if r["oldest"] is not None:
                entry["oldest"] = r["oldest"]
        for r in await self._all(q.QUEUE_RECENT, {"floor": floor}):
            entry = row(r["queue"])
            for key in ("completed", "failed", "cancelled", "completed_5m"):
                entry[key] = r[key]
        for r in await self._all(q.QUEUE_META):
            entry = row(r["queue"])
            entry.update(paused=r["paused"], paused_at=r["paused_at"], paused_by=r["paused_by"])
        for name, n in dlq_depth.items():
            row(name)["dlq"] = n
        for entry in out.values():
            finished = entry["completed"] + entry["failed"] + entry["cancelled"]
            entry["finished"] = finished
            entry["success_pct"] = None if not finished else 100.0 * entry["completed"] / finished
            entry["per_minute"] = entry["completed_5m"] / 5.0
        return sorted(out.values(), key=lambda e: e["queue"])

    # -- jobs ------------------------------------------------------------------------------------

    async def jobs(
        self, *, queue: str | None, kind: str | None, state: str | None, before: int | None
    ) -> Page:
        """Newest jobs below id ``before`` matching the filters, within one id window (see
        :class:`Page`)."""
        filters = {"queue": queue, "kind": kind, "state": state}
        bounds = await self._aggregate(q.ID_BOUNDS)
        lowest, newest = bounds["min"], bounds["max"]
        if newest is None:
            return Page([], 0, 0, None)
        top = newest + 1 if before is None else min(before, newest + 1)
        floor = max(top - q.SCAN_WINDOW_IDS, lowest)
        rows = await self._all(
            q.JOB_PAGE, {**filters, "before": top, "floor": floor, "limit": q.PAGE_ROWS}
        )
        if len(rows) == q.PAGE_ROWS:
            next_before = rows[-1]["id"]
        else:
            next_before = floor if floor > lowest else None
        if next_before is not None and next_before <= lowest:
            next_before = None
        return Page(rows, top, floor, next_before)

    async def job(self, job_id: int) -> dict | None:
        """Every column of job ``job_id`` (from the DLQ if it was dead-lettered; ``in_dlq``
        says which), or ``None``."""
        row = await self._one(q.JOB_DETAIL, {"id": job_id})
        if row is None:
            row = await self._one(q.DLQ_DETAIL, {"id": job_id})
        return row

    async def lineage(self, job: dict) -> tuple[dict | None, Any, list[dict]]:
        """``(trigger, trigger_id, follow_ups)``: the job that staged this one (``None`` when
        unknown or gone; ``trigger_id`` is the raw provenance value) and the follow-ups this job
        staged (at most ``CHILD_ROWS``)."""
        raw = (job.get("metadata") or {}).get(q.PROVENANCE_KEY)
        trigger = None
        if isinstance(raw, int) and not isinstance(raw, bool) and 0 < raw < 2**63:
            trigger = await self._one(q.JOB_SUMMARY, {"id": raw})
        children = await self._all(q.JOB_CHILDREN, {"id": job["id"], "limit": q.CHILD_ROWS})
        return trigger, raw, children

    async def dlq(self, *, queue: str | None, kind: str | None, before: int | None) -> Page:
        """Newest DLQ entries below id ``before`` matching the filters (keyset, no window)."""
        top = before if before is not None else 2**63 - 1
        rows = await self._all(
            q.DLQ_PAGE, {"queue": queue, "kind": kind, "before": top, "limit": q.PAGE_ROWS}
        )
        full = len(rows) == q.PAGE_ROWS
        return Page(rows, top, 0, rows[-1]["id"] if full else None, windowed=False)

    # -- consequences, workers -------------------------------------------------------------------

    async def consequences(self) -> dict:
        """Owed / overdue counts, the first ``OWED_ROWS`` owed (oldest retry first) and the
        applied ones among the newest ``SAMPLE_IDS`` job ids."""
        counts = await self._aggregate(q.CONSEQUENCE_COUNTS)
        owed = await self._all(q.CONSEQUENCES_OWED, {"limit": q.OWED_ROWS})
        bounds = await self._aggregate(q.ID_BOUNDS)
        floor = (bounds["max"] or 0) - q.SAMPLE_IDS + 1
        applied = await self._all(q.CONSEQUENCES_APPLIED, {"floor": floor, "limit": q.PAGE_ROWS})
        return {
            "owed_count": counts["owed"],
            "overdue_count": counts["overdue"],
            "owed": owed,
            "applied": applied,
        }

    async def workers(self) -> dict:
        """The maintenance leader's backend and lease, the live processes' presence rows (at most
        ``PRESENCE_ROWS``), client connections to this database and the running attempts (at
        most ``RUNNING_ROWS``)."""
        return {
            "leader": await self._one(q.LEADER, {"key": self.binding.leader_lock_key}),
            "lease": await self._one(q.LEADER_LEASE),
            "processes": await self._all(q.PRESENCE, {"limit": q.PRESENCE_ROWS}),
            "connections": await self._all(q.CONNECTIONS),
            "running_count": (await self._aggregate(q.RUNNING_COUNT))["count"],
            "running": await self._all(q.RUNNING, {"limit": q.RUNNING_ROWS}),
        }
