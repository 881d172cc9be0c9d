"""The rescue passes: running attempts with a stale heartbeat or a passed deadline, and parked
jobs whose callback timed out, go back to retry, fail (to the DLQ when their queue has it) or,
for kinds the settler settles, wait in ``consequence_pending``."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from awa_fast import bulk, metrics, sql
from awa_fast.worker.maintenance.passes import PassContext, cancel_duplicate, fetch, ids

log = logging.getLogger("awa_fast.maintenance")

# A rescue pass takes stale attempts (and, apart, expired callbacks) 500 at a time, each batch
# its own transaction, until a batch comes back short or this many ran.
RESCUE_BATCH = 500
RESCUE_BATCHES = 20


class Rescue:
    """The rescue passes of one process's maintenance.

    ``on_rescued`` (optional) is awaited with the rescued rows after each rescue commits
    (registered Rescued specs). ``consequence_kinds()`` lists the kinds whose final-attempt
    rescue goes to ``consequence_pending`` instead of ``failed`` (the settler then settles them
    in the reconciler: the failure consequence and exhausted specs). ``known_kinds()`` lists
    the kinds this process has handlers for. ``own_attempts()`` lists the attempts this
    process still runs (``"id:run_lease"``): a stale heartbeat never rescues them (their beats
    stalled; a passed deadline still does).
    """

    def __init__(
        self,
        ctx: PassContext,
        on_rescued: Callable[[list[tuple]], Awaitable[None]] | None,
        consequence_kinds: Callable[[], list[str]],
        known_kinds: Callable[[], list[str]],
        own_attempts: Callable[[], list[str]],
    ):
        self.ctx = ctx
        self.on_rescued = on_rescued
        self.consequence_kinds = consequence_kinds
        self.known_kinds = known_kinds
        self.own_attempts = own_attempts

    async def rescue(self, *, running: bool = True, callbacks: bool = True) -> list[tuple]:
        """Rescue running attempts with a stale heartbeat or a passed deadline (``running``), and
        parked jobs whose callback timed out (``callbacks``). Final attempts fail (moved to the
        DLQ when their queue has it) or, for ``consequence_kinds()`` (a failure consequence or
        exhausted specs), wait in ``consequence_pending`` for the reconciler's settlement.
        Returns rows ``(id, kind, new_state, rescue_reason, exhausted_reason)``.

        In batches of ``RESCUE_BATCH`` (500), each one transaction, until a batch comes back
        short or ``RESCUE_BATCHES`` (20) ran: a batch's rescue and the dead-letter moves of the
        rows it failed commit together. A row whose rescue collides on its unique key is
        cancelled as a duplicate; a row whose dead-letter move fails stays ``failed`` in
        ``jobs`` with that error appended; any other row that fails alone is left as it was
        (logged); the rest proceed.

        Raises:
            Deposed: another process took leadership.
            psycopg.Error: a batch's transaction failed (the loop retries).
        """
        params = {
            "stale_ms": self.ctx.config.heartbeat_staleness_ms,
            "limit": RESCUE_BATCH,
            "consequence_kinds": self.consequence_kinds(),
            "known_kinds": self.known_kinds(),
            "only": None,
        }
        rows: list[tuple] = []
        # Batch after batch, each its own transaction, while one comes back full: one batch a
        # pass (500 every 30 s) took minutes to rescue what a crashed launcher left running.
        for _ in range(RESCUE_BATCHES):
            async with self.ctx.fenced(bounded=True) as conn:
                # Read once the connection is held, with no await before the statement: an
                # attempt claimed while the pass waited for its connection is in it.
                params["own"] = self.own_attempts()
                found: list[tuple] = []
                if running:
                    found += await self._rescue_with(
                        conn, "rescue", sql.RESCUE, sql.RESCUE_CANDIDATES, params
                    )
                if callbacks:
                    found += await self._rescue_with(
                        conn,
                        "callback rescue",
                        sql.RESCUE_CALLBACKS,
                        sql.RESCUE_CALLBACK_CANDIDATES,
                        params,
                    )
                await self._dead_letter(conn, [(r[0], r[4]) for r in found if r[2] == "failed"])
            rows += found
            if len(found) < RESCUE_BATCH:
                break
        if rows:
            self.ctx.counts["rescued"] += len(rows)
            metrics.rescued(rows)
            log.info("rescued %d job(s)", len(rows))
            if self.on_rescued is not None:
                await self.on_rescued(rows)
        return rows

    async def _rescue_with(
        self, conn, what: str, query: str, candidates: str, params: dict
    ) -> list[tuple]:
        done = await bulk.run_isolated(
            conn,
            what=what,
            bulk=lambda: fetch(conn, query, params),
            keys=lambda skip: ids(fetch(conn, candidates, {**params, "skip": skip})),
            one=lambda job_id: fetch(conn, query, {**params, "only": job_id}),
            on_conflict=lambda job_id, _exc: cancel_duplicate(
                conn, sql.CANCEL_RESCUED_DUPLICATE, {**params, "id": job_id}
            ),
            recurring=self.ctx.recurring[what],
            batch=params["limit"],
        )
        return done.rows

    async def _dead_letter(self, conn, moves: list[tuple[int, str]]) -> None:
        # Inside the rescue's transaction; a row whose move fails stays failed (noted).
        if not moves:
            return

        async def note(job_id, exc):
            await conn.execute(sql.NOTE_DEAD_LETTER_FAILED, {"id": job_id, "error": str(exc)})

        reasons = dict(moves)
        await bulk.run_isolated(
            conn,
            what="dead-letter move",
            bulk=lambda: fetch(
                conn, sql.DEAD_LETTER_MANY, ([m[0] for m in moves], [m[1] for m in moves])
            ),
            keys=[m[0] for m in moves],
            one=lambda job_id: fetch(conn, sql.DEAD_LETTER, (job_id, reasons[job_id])),
            on_conflict=note,
            on_error=note,
        )
