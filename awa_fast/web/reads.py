"""What each dashboard page shows, read through :class:`~awa_fast.repo.dashboard.DashboardRepo`
(the bounded statements of ``awa_fast.sql.dashboard``, dict rows).

Reads go through their own small pool: autocommit, no server-side prepared statements (so each
statement is planned with its actual parameter values, as the plan test checks) and a statement
timeout per read (each read its own transaction), so a slow page fails with a 503 instead of
holding a connection. Both of the dashboard's pools (this one and its client's) wait for the
database as :func:`bounded` says.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable
from typing import Any, Concatenate, ParamSpec, TypeVar

from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import PoolTimeout

from awa_fast.connections import Pool
from awa_fast.pg_connection import connection_class
from awa_fast.repo.dashboard import DashboardRepo
from awa_fast.schema_binding import DEFAULT, SchemaBinding
from awa_fast.sql import dashboard as q

P = ParamSpec("P")
T = TypeVar("T")

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
ACTIVE_STATES = q.LIVE_STATES


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
        return _last_id(self.rows) if len(self.rows) == q.PAGE_ROWS else self.floor


def _last_id(rows: list[dict]) -> int:
    """The id of a page's last (oldest) row: the keyset cursor of the next page."""
    last: int = rows[-1]["id"]
    return last


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
                    kwargs={"autocommit": True, "prepare_threshold": None},
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

    async def _read(
        self,
        read: Callable[Concatenate[DashboardRepo, P], Awaitable[T]],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        # One read, one transaction with its own statement timeout (SET LOCAL, never the
        # session's: through a transaction pooler a session SET stays on a server connection
        # workers get next).
        async with self._pool.connection() as conn, conn.transaction():
            repo = DashboardRepo(conn)
            await repo.limit_statement_time()
            return await read(repo, *args, **kwargs)

    # -- queues ----------------------------------------------------------------------------------

    async def queues(self, dlq_depth: dict[str, int]) -> list[dict]:
        """One dict per queue: active depth by state, oldest available run_at, recent outcomes
        (newest ``SAMPLE_IDS`` ids), paused flag and DLQ depth."""
        bounds = await self._read(DashboardRepo.id_bounds)
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

        for r in await self._read(DashboardRepo.queue_depth):
            entry = row(r["queue"])
            entry["depth"][r["state"]] = r["n"]
            if r["oldest"] is not None:
                entry["oldest"] = r["oldest"]
        for r in await self._read(DashboardRepo.queue_recent, floor):
            entry = row(r["queue"])
            for key in ("completed", "failed", "cancelled", "completed_5m"):
                entry[key] = r[key]
        for r in await self._read(DashboardRepo.queue_meta):
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
        bounds = await self._read(DashboardRepo.id_bounds)
        lowest, newest = bounds["min"], bounds["max"]
        if newest is None:
            return Page([], 0, 0, None)
        top = newest + 1 if before is None else min(before, newest + 1)
        floor = max(top - q.SCAN_WINDOW_IDS, lowest)
        rows = await self._read(DashboardRepo.job_page, filters, top, floor)
        next_before: int | None
        if len(rows) == q.PAGE_ROWS:
            next_before = _last_id(rows)
        else:
            next_before = floor if floor > lowest else None
        if next_before is not None and next_before <= lowest:
            next_before = None
        return Page(rows, top, floor, next_before)

    async def job(self, job_id: int) -> dict | None:
        """Every column of job ``job_id`` (from the DLQ if it was dead-lettered; ``in_dlq``
        says which), or ``None``."""
        row = await self._read(DashboardRepo.job, job_id)
        if row is None:
            row = await self._read(DashboardRepo.dlq_job, job_id)
        return row

    async def lineage(self, job: dict) -> tuple[dict | None, Any, list[dict]]:
        """``(trigger, trigger_id, follow_ups)``: the job that staged this one (``None`` when
        unknown or gone; ``trigger_id`` is the raw provenance value) and the follow-ups this job
        staged (at most ``CHILD_ROWS``)."""
        raw = (job.get("metadata") or {}).get(q.PROVENANCE_KEY)
        trigger = None
        if isinstance(raw, int) and not isinstance(raw, bool) and 0 < raw < 2**63:
            trigger = await self._read(DashboardRepo.job_summary, raw)
        children = await self._read(DashboardRepo.job_children, job["id"])
        return trigger, raw, children

    async def dlq(self, *, queue: str | None, kind: str | None, before: int | None) -> Page:
        """Newest DLQ entries below id ``before`` matching the filters (keyset, no window)."""
        top = before if before is not None else 2**63 - 1
        rows = await self._read(DashboardRepo.dlq_page, queue, kind, top)
        full = len(rows) == q.PAGE_ROWS
        return Page(rows, top, 0, _last_id(rows) if full else None, windowed=False)

    # -- consequences, workers -------------------------------------------------------------------

    async def consequences(self) -> dict:
        """Owed / overdue counts, the first ``OWED_ROWS`` owed (oldest retry first) and the
        applied ones among the newest ``SAMPLE_IDS`` job ids."""
        counts = await self._read(DashboardRepo.consequence_counts)
        owed = await self._read(DashboardRepo.consequences_owed)
        bounds = await self._read(DashboardRepo.id_bounds)
        floor = (bounds["max"] or 0) - q.SAMPLE_IDS + 1
        applied = await self._read(DashboardRepo.consequences_applied, floor)
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
            "leader": await self._read(DashboardRepo.leader, self.binding.leader_lock_key),
            "lease": await self._read(DashboardRepo.leader_lease),
            "processes": await self._read(DashboardRepo.presence),
            "connections": await self._read(DashboardRepo.connections),
            "running_count": await self._read(DashboardRepo.running_count),
            "running": await self._read(DashboardRepo.running),
        }
