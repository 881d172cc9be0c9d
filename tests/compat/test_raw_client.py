"""awa-pg's RawClient keeps its native client's legacy ``<method>_sync`` API: every blocking
Client method has a ``_sync`` twin on RawClient and on any client's ``_raw`` (the attribute
through which awa-pg's wrapper reaches that native client), callable from a coroutine, and
the twins know what the client registered."""

from __future__ import annotations

import inspect

import psycopg

import awa_fast as awa
from awa_fast.raw_client import NOT_TWINNED, SYNC_TWINS
from awa_fast.sync_client import Client


def test_raw_client_has_a_sync_twin_of_every_blocking_method():
    blocking = {n for n, f in vars(Client).items() if callable(f) and not n.startswith("_")}
    assert set(SYNC_TWINS) == blocking - NOT_TWINNED
    for name in SYNC_TWINS:
        twin = getattr(awa.RawClient, f"{name}_sync")
        assert not inspect.iscoroutinefunction(twin), name
    assert issubclass(awa.RawClient, awa.AsyncClient)


def _park(dsn: str, job_id: int) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return str(
            conn.execute(
                "UPDATE awa_fast.jobs SET state = 'waiting_external', attempt = 1, "
                "run_lease = 1, callback_id = gen_random_uuid(), "
                "callback_timeout_at = now() + interval '1 hour' "
                "WHERE id = %s RETURNING callback_id",
                (job_id,),
            ).fetchone()[0]
        )


async def test_raw_client_sync_twins_work_from_a_coroutine(dsn):
    raw = awa.RawClient(dsn)
    try:
        inserted = raw.insert_sync({"n": 1}, kind="raw_twin", queue="raw_q")
        assert (await raw.get_job(inserted.id)).id == inserted.id  # the async side too
        assert raw.get_job_sync(inserted.id).state == awa.JobState.Available
        cid = _park(dsn, inserted.id)
        done = raw.complete_external_sync(cid, {"ok": True})
        assert done.state == awa.JobState.Completed
    finally:
        await raw.close()
    assert raw._sync_twins._client is None  # close() closed the blocking client


async def test_raw_fail_external_sync_settles_a_kind_the_client_registered(dsn):
    client = awa.AsyncClient(dsn)
    # awa-fast settles a failure only where its consequence is known (docs/consequences.md):
    # declared on this client, so its ``_raw`` twins know it too.
    client.failure_consequence("raw_fail", awa.NO_FAILURE_CONSEQUENCE)
    try:
        job = await client.insert({"n": 1}, kind="raw_fail")
        failed = client._raw.fail_external_sync(_park(dsn, job.id), "sync failure")
        assert failed.state == awa.JobState.Failed
        assert failed.errors[-1]["error"] == "sync failure"
        job = await client.insert({"n": 2}, kind="raw_fail")
        result = client._raw.resolve_callback_sync(_park(dsn, job.id), default_action="complete")
        assert result.is_completed()
    finally:
        await client.close()
