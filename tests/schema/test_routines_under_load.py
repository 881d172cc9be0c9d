"""Routines re-applied while a worker claims and completes jobs (ADR 043): no statement of
either side fails or deadlocks, and no job runs without its triggers."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time

import psycopg
import pytest

import awa_fast as awa
from awa_fast.schema import migrate_sync, routines_digest


@dataclasses.dataclass
class Tick:
    n: int


@pytest.mark.asyncio
async def test_routines_reapplied_while_jobs_run(fresh_db):
    migrate_sync(fresh_db)
    client = awa.AsyncClient(fresh_db)
    done: set[int] = set()

    @client.task(Tick, kind="tick", queue="load_q")
    async def tick(job):
        done.add(job.args.n)

    await client.start([("load_q", 8)], poll_interval_ms=20, maintenance=False)
    failures: list[BaseException] = []

    def reapply(rounds: int) -> None:
        for _ in range(rounds):
            with psycopg.connect(fresh_db, autocommit=True) as conn:
                conn.execute("UPDATE awa_fast.schema_routines SET sha256 = 'stale'")
            try:
                migrate_sync(fresh_db)
            except Exception as exc:
                failures.append(exc)

    total = 600
    try:
        reapplier = asyncio.create_task(asyncio.to_thread(reapply, 15))
        for n in range(total):
            await client.insert(
                Tick(n), queue="load_q", unique_opts={"by_args": True} if n % 2 else None
            )
            if n % 50 == 0:
                await asyncio.sleep(0)
        await reapplier
        for _ in range(600):
            if len(done) == total:
                break
            await asyncio.sleep(0.1)
    finally:
        await client.shutdown()
    assert failures == []
    assert len(done) == total
    with psycopg.connect(fresh_db) as conn:
        assert conn.execute("SELECT sha256 FROM awa_fast.schema_routines").fetchone() == (
            routines_digest(),
        )


def test_routines_deadlocked_with_a_completion_are_applied_again(fresh_db):
    # A completion holds a slice of jobs_done and then wants jobs (the finalizer's order); the
    # routines hold jobs and want that slice (their trigger changes): the server cancels one.
    # This session waits a minute before it checks for a deadlock, so the migrate() is the one
    # cancelled: it runs its transaction again once the completion has committed, and succeeds.
    migrate_sync(fresh_db)
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        conn.execute("UPDATE awa_fast.schema_routines SET sha256 = 'stale'")
        (slice_,) = conn.execute(
            "SELECT inhrelid::regclass::text FROM pg_inherits "
            "WHERE inhparent = 'awa_fast.jobs_done'::regclass ORDER BY inhrelid LIMIT 1"
        ).fetchone()
    results: list = []
    with psycopg.connect(fresh_db) as completion:
        completion.execute("SET deadlock_timeout = '1min'")
        completion.execute(f"LOCK TABLE {slice_} IN ROW EXCLUSIVE MODE")
        migrator = threading.Thread(target=lambda: results.append(_migrate(fresh_db)))
        migrator.start()
        with psycopg.connect(fresh_db, autocommit=True) as watch:
            # the routines hold jobs and wait for the slice (the server's lock table says so)
            for _ in range(600):
                if watch.execute(
                    "SELECT 1 FROM pg_locks WHERE NOT granted AND relation = %s::regclass",
                    (slice_,),
                ).fetchone():
                    break
                time.sleep(0.05)
            else:
                raise AssertionError("the routines never waited for the slice")
        completion.execute("LOCK TABLE awa_fast.jobs IN ROW EXCLUSIVE MODE")  # the deadlock
        completion.commit()
        migrator.join(120)
    assert results == [[]], results
    with psycopg.connect(fresh_db) as conn:
        assert conn.execute("SELECT sha256 FROM awa_fast.schema_routines").fetchone() == (
            routines_digest(),
        )


def _migrate(dsn: str) -> object:
    try:
        return migrate_sync(dsn)
    except Exception as exc:  # reported by the test's assertion
        return exc
