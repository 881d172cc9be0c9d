"""The reconciler tick (maintenance leader): owed failure consequences and ``verify_success``."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from awa_fast import sql

log = logging.getLogger("awa_fast.reconcile")

OWED_BATCH = 100
VERIFY_BATCH = 100


async def reconcile_tick(client: Any, config: Any) -> dict:
    """Retry every owed consequence that is due (each in its own transaction), then run each
    kind's ``verify_success`` hook once on its recently completed jobs (within
    ``config.verify_window_s`` seconds), correcting those it reports as not done.

    Returns ``{"reconciled": {job_id: result}, "corrected": [job_id, ...]}``.
    """
    pool = await client.pool()
    async with pool.connection() as conn:
        cur = await conn.execute(sql.OWED_DUE, (OWED_BATCH,))
        ids = [r[0] for r in await cur.fetchall()]
    reconciled = {}
    for job_id in ids:
        try:
            reconciled[job_id] = await client.settler.reconcile_one(pool, job_id)
        except Exception:  # one bad job must not stop the others
            log.exception("reconciling job %s failed", job_id)
    corrected = await _verify(client, pool, config)
    return {"reconciled": reconciled, "corrected": corrected}


async def _verify(client: Any, pool: Any, config: Any) -> list[int]:
    verifiers = client.registry.verifiers
    if not verifiers:
        return []
    async with pool.connection() as conn:
        cur = await conn.execute(sql.UNVERIFIED_COMPLETED,
                                 (list(verifiers), config.verify_window_s, VERIFY_BATCH))
        rows = await cur.fetchall()
    corrected = []
    for row in rows:
        job = client.consequences.snapshot(row)
        try:
            verdict = verifiers[job.kind](job)
            if asyncio.iscoroutine(verdict):
                verdict = await verdict
        except Exception:  # an unverifiable job stays unverified and is retried next tick
            log.exception("verify_success of %s job %s raised", job.kind, job.id)
            continue
        async with pool.connection() as conn:
            await conn.execute(sql.MARK_VERIFIED, ([job.id],))
        if not verdict:
            await client.correct_to_failed(job.id, error="verify_success: the job's work was "
                                                         "found not done")
            corrected.append(job.id)
    return corrected
