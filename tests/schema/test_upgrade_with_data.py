"""Issue 28, class 5: an upgrade from an intermediate schema version with jobs in every state.

For a few released versions (tests/schema/history.py: the schema as the released migrations
made it, with that era's functions and triggers and its own rows), a database is restored at
that version, filled with plain SQL of that version's columns -- jobs in every state, unique keys
held by live and finished jobs, a DLQ entry, a job whose consequence is pending --, upgraded to
head, and then used: claimed and completed, unique conflicts against the old holders, admin
reads of every row.
"""

from __future__ import annotations

import asyncio
import dataclasses

import psycopg
import pytest

import awa_fast as awa
from awa_fast.requests import prepare
from awa_fast.schema import current_migration_version, migrate
from tests.schema import history
from tests.support import FAST

STATES = [
    "scheduled",
    "available",
    "running",
    "retryable",
    "completed",
    "failed",
    "cancelled",
    "waiting_external",
    "consequence_pending",
]


@dataclasses.dataclass
class Old:
    n: int


def _key(n: int) -> bytes:
    return prepare(Old(n), unique_opts={}).unique_key


def _fill(conn: psycopg.Connection) -> dict[str, int]:
    ids = {}
    for n, state in enumerate(STATES):
        extra = {
            "running": ", heartbeat_at = now(), attempted_at = now(), attempt = 1, run_lease = 1",
            "waiting_external": ", callback_id = gen_random_uuid(), attempt = 1, run_lease = 1,"
            " callback_timeout_at = now() + interval '1 hour'",
            "retryable": ", attempt = 1, run_at = now() + interval '1 hour'",
            "scheduled": ", run_at = now() + interval '1 hour'",
            "consequence_pending": ", attempt = 25, run_lease = 1",
        }.get(state, "")
        finished = state in ("completed", "failed", "cancelled")
        row = conn.execute(
            "INSERT INTO awa_fast.jobs (kind, queue, args, state, unique_key, unique_states, "
            "finalized_at) VALUES ('old', 'upgrade', %s, %s, %s, 255, "
            f"{'now()' if finished else 'NULL'}) RETURNING id",
            (f'{{"n": {n}}}', state, _key(n)),
        ).fetchone()
        conn.execute(f"UPDATE awa_fast.jobs SET state = state {extra} WHERE id = %s", (row[0],))
        ids[state] = row[0]
    # a DLQ entry, as dead_letter_if_enabled leaves one (its columns are the job's)
    dead = 1_000_000
    conn.execute(
        "INSERT INTO awa_fast.dlq (id, kind, queue, args, state, finalized_at, dlq_reason, "
        "original_run_lease) VALUES (%s, 'old', 'upgrade', '{\"n\": 99}', 'failed', now(), "
        "'exhausted', 1)",
        (dead,),
    )
    ids["dlq"] = dead
    return ids


@pytest.mark.parametrize("version", history.VERSIONS)
async def test_an_upgrade_from_an_older_version_keeps_every_state_working(fresh_db, version):
    assert version < current_migration_version()
    history.restore(fresh_db, version)
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        assert conn.execute("SELECT max(version) FROM awa_fast.schema_version").fetchone()[0] == (
            version
        )
        ids = _fill(conn)
    await migrate(fresh_db)

    client = awa.AsyncClient(fresh_db)
    try:
        # admin reads of every row, in its state
        for state, job_id in ids.items():
            if state == "dlq":
                entry = await client.get_dlq_job(job_id)
                assert entry is not None and entry.job.id == job_id
                continue
            job = await client.get_job(job_id)
            assert str(job.state) == state
        stats = {s.queue: s for s in await client.queue_stats()}
        assert "upgrade" in stats
        assert len(await client.list_jobs(queue="upgrade", limit=100)) >= len(STATES) - 1

        # unique keys held by old live and finished rows still conflict
        for n, _state in enumerate(STATES):
            with pytest.raises(awa.UniqueConflict):
                await client.insert(Old(n), queue="upgrade", unique_opts={})
        fresh_key = await client.insert(Old(1000), queue="upgrade", unique_opts={})
        assert fresh_key.id

        # claim and complete: the old available row and a new one
        done = asyncio.Event()
        ran: list[int] = []

        @client.task(
            Old, kind="old", queue="upgrade", failure_consequence=awa.NO_FAILURE_CONSEQUENCE
        )
        async def old(job):
            ran.append(job.id)
            if ids["available"] in ran and fresh_key.id in ran:
                done.set()

        await client.start([("upgrade", 2)], **{**FAST, "maintenance": False})
        await asyncio.wait_for(done.wait(), 30)
        await client.shutdown(timeout_ms=2000)
        for job_id in (ids["available"], fresh_key.id):
            assert str((await client.get_job(job_id)).state) == "completed"
    finally:
        await client.close()
