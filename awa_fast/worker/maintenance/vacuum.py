"""The hot-table vacuum pass: VACUUM ``awa_fast.jobs`` between autovacuum's visits, cutting
off its empty tail only when the heap grew past a bound (ADR 016)."""

from __future__ import annotations

import asyncio
import contextlib

import psycopg

from awa_fast import pg_connection
from awa_fast import pooler as pooler_mode
from awa_fast.repo.maintenance import PassRepo
from awa_fast.schema_binding import SchemaBinding
from awa_fast.worker.maintenance.passes import PassContext


class HotVacuum:
    """The vacuum pass of one process's maintenance, on a connection of its own (autocommit:
    VACUUM runs outside a transaction), opened when needed and closed by :meth:`close`.

    Attributes:
        conn: that connection, or ``None`` before the first pass and after :meth:`close`.
    """

    def __init__(
        self, ctx: PassContext, database_url: str, pooler: str | None, binding: SchemaBinding
    ):
        self.ctx = ctx
        self.database_url = database_url
        self.pooler = pooler
        self._connection_class = pg_connection.connection_class(binding)
        self.conn: psycopg.AsyncConnection | None = None
        self._truncate_failed_at: float | None = None  # the event loop's clock, seconds

    async def vacuum_hot(self) -> bool:
        """VACUUM the hot table when its dead rows passed ``hot_vacuum_dead_rows``, or when the
        statistics have seen no vacuum of it (reset by crash recovery or ``pg_stat_reset``,
        which zero the dead-row count but leave the dead rows; with ``track_counts`` off they
        never count, so every pass vacuums), on a connection of its own (autocommit).
        Autovacuum visits a database at most once per ``autovacuum_naptime`` (60 s by
        default): at thousands of jobs per second that alone leaves hundreds of thousands of
        dead rows between visits. Returns True if it vacuumed.

        The empty pages at the table's end are cut off only while its heap is larger than
        ``hot_vacuum_truncate_bytes`` (64 MiB; after a backlog drained): cutting them off takes
        an ACCESS EXCLUSIVE lock that stops every claim, insert and completion, and at a steady
        rate the table grows back within a second (ADR 016, migration 016). Above the limit it
        asks whatever the dead rows (a backlog drained before a quiet spell). One that asked and
        did not leave the heap below the limit (PostgreSQL gave up after waiting 5 s for the
        lock, the tail still held live rows, autovacuum held the table, or the VACUUM raised)
        does not ask again for ``hot_vacuum_truncate_retry_ms`` (60 s): each such wait is 5 s
        without a vacuum. ``counts["hot_truncations"]`` counts the vacuums that asked.

        Raises:
            psycopg.Error: the statistics or the VACUUM failed (the loop retries).
        """
        if self.conn is None or self.conn.closed or self.conn.broken:
            self.conn = await self._connection_class.connect(
                self.database_url, autocommit=True, **pooler_mode.connect_options(self.pooler)
            )
        conn = self.conn
        loop = asyncio.get_running_loop()
        repo = PassRepo(conn)
        row = await repo.hot_table()
        if row is None:
            return False
        limit = self.ctx.config.hot_vacuum_truncate_bytes
        failed_at = self._truncate_failed_at
        retry_s = self.ctx.config.hot_vacuum_truncate_retry_ms / 1000
        if row.heap_bytes > limit and (failed_at is None or loop.time() - failed_at >= retry_s):
            # Also with few dead rows: a backlog drained before a quiet spell must still be cut.
            # Counted as failed until the heap is seen below the limit (a VACUUM that raises,
            # or is skipped, does not ask again at once either).
            self._truncate_failed_at = loop.time()
            self.ctx.counts["hot_truncations"] += 1
            await repo.vacuum_hot(truncate=True)
            after = await repo.hot_table()
            if after is not None and after.heap_bytes <= limit:
                self._truncate_failed_at = None
        elif row.dead_rows < self.ctx.config.hot_vacuum_dead_rows and row.vacuumed:
            # (Statistics that have seen no vacuum were reset, by crash recovery say: their
            # count of zero says nothing of the dead rows a quiet table still holds.)
            return False
        else:
            await repo.vacuum_hot(truncate=False)
        self.ctx.counts["hot_vacuums"] += 1
        return True

    async def close(self) -> None:
        """Close the vacuum's connection (a dead one too: it is gone either way)."""
        if self.conn is not None:
            with contextlib.suppress(Exception):
                await self.conn.close()
            self.conn = None
