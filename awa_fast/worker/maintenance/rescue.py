"""The rescue passes: running attempts with a stale heartbeat or a passed deadline, and parked
jobs whose callback timed out, go back to retry, fail (to the DLQ when their queue has it) or,
for kinds the settler settles, wait in ``consequence_pending``."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from awa_fast import bulk, metrics, sql
from awa_fast.repo.maintenance import PassRepo, Rescued
from awa_fast.worker.maintenance.passes import PassContext, cancel_duplicate, fetch, fetch_ids

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
        on_rescued: Callable[[list[Rescued]], Awaitable[None]] | None,
        consequence_kinds: Callable[[], list[str]],
        known_kinds: Callable[[], list[str]],
        own_attempts: Callable[[], list[str]],
    ):
        self.ctx = ctx
        self.on_rescued = on_rescued
        self.consequence_kinds = consequence_kinds
        self.known_kinds = known_kinds
        self.own_attempts = own_attempts

    async def rescue(self, *, running: bool = True, callbacks: bool = True) -> list[Rescued]:
        """Rescue running attempts with a stale heartbeat or a passed deadline (``running``), and
        parked jobs whose callback timed out (``callbacks``). Final attempts fail (moved to the
        DLQ when their queue has it) or, for ``consequence_kinds()`` (a failure consequence or
        exhausted specs), wait in ``consequence_pending`` for the reconciler's settlement.
        Returns the jobs taken (``Rescued``: id, kind, new state, rescue and exhausted
        reasons).

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
        rows: list[Rescued] = []
        # Batch after batch, each its own transaction, while one comes back full: one batch a
        # pass (500 every 30 s) took minutes to rescue what a crashed launcher left running.
        for _ in range(RESCUE_BATCHES):
            async with self.ctx.fenced(bounded=True) as conn:
                # Read once the connection is held, with no await before the statement: an
                # attempt claimed while the pass waited for its connection is in it.
                params["own"] = self.own_attempts()
                found: list[Rescued] = []
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
                failed = [(r.id, r.exhausted_reason) for r in found if r.state == "failed"]
                await self._dead_letter(conn, failed)
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
    ) -> list[Rescued]:
        repo = PassRepo(conn)
        done = await bulk.run_isolated(
            conn,
            what=what,
            bulk=lambda: repo.rescued(query, params),
            keys=lambda skip: fetch_ids(conn, candidates, {**params, "skip": skip}),
            one=lambda job_id: repo.rescued(query, {**params, "only": job_id}),
            on_conflict=lambda job_id, _exc: cancel_duplicate(
                conn, sql.CANCEL_RESCUED_DUPLICATE, {**params, "id": job_id}
            ),
            recurring=self.ctx.recurring[what],
            batch=params["limit"],
        )
        return done.rows

    async def _dead_letter(self, conn, moves: list[tuple[int, str | None]]) -> None:
        # Inside the rescue's transaction; a row whose move fails stays failed (noted).
        if not moves:
            return

        async def note(job_id, exc):
            await PassRepo(conn).note_dead_letter_failed(job_id, str(exc))

        reasons = dict(moves)
        await bulk.run_isolated(
            conn,
            what="dead-letter move",
            bulk=lambda: fetch(
                conn,
                sql.DEAD_LETTER_MANY,
                ([job_id for job_id, _ in moves], [reason for _, reason in moves]),
            ),
            keys=[job_id for job_id, _ in moves],
            one=lambda job_id: fetch(conn, sql.DEAD_LETTER, (job_id, reasons[job_id])),
            on_conflict=note,
            on_error=note,
        )
