"""The statements of the leader's maintenance passes (``sql.maintenance``, ``sql.finished``,
``sql.dlq``): promote, rescue, prune and the finished slices, the counter fold, the hot
table's vacuum. Most passes run a statement over a batch and, when it fails, the same work row
by row (``bulk.run_isolated``): :meth:`PassRepo.rows` / :meth:`PassRepo.ids` run the pass's
bulk, candidate and one-row statements, named in ``sql``, that a pass hands over."""

from __future__ import annotations

from typing import Any, NamedTuple

from awa_fast import sql
from awa_fast.repo import Repo, named
from awa_fast.rows import one_row


class Rescued(NamedTuple):
    """A job a rescue took over: its new state and why (``rescue_reason``: stale heartbeat,
    deadline, expired callback; ``exhausted_reason`` when it was its last attempt)."""

    id: int
    kind: str
    state: str
    rescue_reason: str
    exhausted_reason: str | None


class HotTable(NamedTuple):
    """The hot table's dead rows, heap size (bytes) and whether its statistics saw a vacuum."""

    dead_rows: int
    heap_bytes: int
    vacuumed: bool


_RESCUED = named(Rescued)
_HOT_TABLE = named(HotTable)


class PassRepo(Repo):
    """Maintenance statements on ``conn`` (a psycopg ``AsyncConnection``; the caller's
    transaction: a leader-fenced one for every write)."""

    __slots__ = ()

    async def rows(self, statement: str, params: Any) -> list[tuple]:
        """The rows of one of a pass's statements (``sql.PROMOTE``, ``sql.PRUNE_DLQ``, ...)."""
        cur = await self.conn.execute(statement, params)
        return await cur.fetchall()

    async def ids(self, statement: str, params: Any) -> list[int]:
        """The job ids a candidate statement (``sql.DUE_IDS``, ...) returns (its one column)."""
        return [job_id for (job_id,) in await self.rows(statement, params)]

    async def run(self, statement: str, params: Any = None) -> int:
        """Run a statement returning nothing of interest; the rows it touched."""
        cur = await self.conn.execute(statement, params)
        return cur.rowcount

    async def rescued(self, statement: str, params: Any) -> list[Rescued]:
        """Run a rescue statement (``sql.RESCUE``, ``sql.RESCUE_CALLBACKS``): the jobs taken."""
        return await self._all(_RESCUED, statement, params)

    async def note_dead_letter_failed(self, job_id: int, error: str) -> None:
        """Append ``error`` to a failed job whose dead-letter move failed (it stays failed)."""
        await self.conn.execute(sql.NOTE_DEAD_LETTER_FAILED, {"id": job_id, "error": error})

    async def expired_slices(self, ages: dict[str, Any]) -> list[int]:
        """The slots of the finished slices past their horizons (``ages``: seconds by class)."""
        return await self.ids(sql.EXPIRED_SLICES, ages)

    async def lock_slice(self, slot: int) -> None:
        """Lock the slice's partition ACCESS EXCLUSIVE, waiting at most 200 ms."""
        await self.conn.execute(sql.SLICE_LOCK_TIMEOUT)
        await self.conn.execute(sql.lock_slice(slot))

    async def expired_slice(self, ages: dict[str, Any], slot: int) -> int | None:
        """The rows of slice ``slot`` if it is still expired (read under its lock), else
        ``None``."""
        cur = await self.conn.execute(sql.EXPIRED_SLICE, {**ages, "slot": slot})
        row = await cur.fetchone()
        if row is None:
            return None
        (count,) = row
        return int(count)

    async def truncate_slice(self, slot: int) -> None:
        """TRUNCATE slice ``slot`` and release the unique keys its jobs held."""
        await self.conn.execute(sql.truncate_slice(slot))
        await self.conn.execute(sql.RELEASE_SLICE, {"slot": slot})

    async def fold_counts(self) -> None:
        """Fold the counters of every foldable slot (``sql.FOLD_COUNTS``)."""
        (slots,) = await one_row(await self.conn.execute(sql.LOCK_FOLDABLE_SLOTS))
        if slots:
            await self.conn.execute(sql.FOLD_COUNTS, {"slots": slots})

    async def hot_table(self) -> HotTable | None:
        """The hot table's statistics (``None``: the table is gone)."""
        return await self._one(_HOT_TABLE, sql.HOT_DEAD_ROWS)

    async def vacuum_hot(self, truncate: bool) -> None:
        """VACUUM the hot table (an autocommit connection), cutting its empty tail off when
        ``truncate``."""
        await self.conn.execute(sql.VACUUM_HOT_TRUNCATING if truncate else sql.VACUUM_HOT)
