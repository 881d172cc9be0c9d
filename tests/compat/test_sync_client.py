"""The blocking Client's external-callback twins, resolve_callback, correct_to_failed, storage
calls and per-job COPY opts work on a real PostgreSQL (that it has a twin of every AsyncClient
producer/admin method: tests/admin/test_client_surface.py)."""

from __future__ import annotations

import uuid

import psycopg
import pytest

import awa_fast as awa
from awa_fast.sync_client import Client


@pytest.fixture
def sync_client(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE awa_fast.jobs, awa_fast.queue_meta, awa_fast.dlq")
    c = Client(dsn)
    # awa-fast settles a failure only once its consequence is known (docs/consequences.md)
    for kind in ("parked", "done_kind"):
        c.async_client.failure_consequence(kind, awa.NO_FAILURE_CONSEQUENCE)
    yield c
    c.close()


def _park(dsn: str, client: Client) -> tuple[int, str]:
    """A job parked in waiting_external on a fresh callback (set up directly in SQL)."""
    job = client.insert({"n": 1}, kind="parked", max_attempts=3)
    with psycopg.connect(dsn, autocommit=True) as conn:
        cid = conn.execute(
            "UPDATE awa_fast.jobs SET state = 'waiting_external', attempt = 1, run_lease = 1, "
            "callback_id = gen_random_uuid(), callback_timeout_at = now() + interval '1 hour' "
            "WHERE id = %s RETURNING callback_id",
            (job.id,),
        ).fetchone()[0]
    return job.id, str(cid)


def test_sync_callback_twins(dsn, sync_client):
    c = sync_client
    _, cid = _park(dsn, c)
    assert c.heartbeat_callback(cid, 120).state == awa.JobState.WaitingExternal
    with pytest.raises(awa.ValidationError, match="timeout_seconds"):
        c.heartbeat_callback(cid, -1)
    assert c.complete_external(cid, {"ok": True}).state == awa.JobState.Completed
    _, cid = _park(dsn, c)
    assert c.fail_external(cid, "nope").state == awa.JobState.Failed
    _, cid = _park(dsn, c)
    job = c.retry_external(cid)
    assert job.state == awa.JobState.Available and job.attempt == 0
    with pytest.raises(awa.CallbackNotFound):
        c.complete_external(str(uuid.uuid4()))
    with pytest.raises(awa.ValidationError):
        c.resume_external("not-a-uuid")


def test_resolve_callback_default_actions(dsn, sync_client):
    c = sync_client
    _, cid = _park(dsn, c)
    res = c.resolve_callback(cid, {"x": 1})
    assert res.is_ignored() and res.job is None
    assert res.reason == "no expressions configured, default is ignore"
    res = c.resolve_callback(cid, {"x": 1}, default_action="complete")
    assert res.is_completed() and res.payload == {"x": 1}
    assert res.job.state == awa.JobState.Completed
    _, cid = _park(dsn, c)
    res = c.resolve_callback(cid, default_action="fail")
    assert res.is_failed() and res.job.state == awa.JobState.Failed
    assert res.job.errors[-1]["error"] == "callback failed: default action"
    with pytest.raises(awa.ValidationError, match="unknown default_action: maybe"):
        c.resolve_callback(cid, default_action="maybe")
    with pytest.raises(awa.CallbackNotFound):
        c.resolve_callback(str(uuid.uuid4()))


def test_correct_to_failed_and_retry_failed_result(dsn, sync_client):
    c = sync_client
    job = c.insert({"n": 1}, kind="done_kind", queue="rf")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE awa_fast.jobs SET state = 'completed', attempt = 1, "
            "finalized_at = now() WHERE id = %s",
            (job.id,),
        )
    failed = c.correct_to_failed(job.id, error="refund bounced")
    assert failed.state == awa.JobState.Failed
    result = c.retry_failed(queue="rf")
    assert isinstance(result, awa.RetryFailedResult)
    assert result.matched == 1 and result.pruned_failed_count is None
    assert [j.id for j in result.jobs] == [job.id] and result.jobs[0].attempt == 0
    with pytest.raises(ValueError, match="Specify exactly one of kind or queue"):
        c.retry_failed()


def test_storage_calls_answer_for_awa_fast(sync_client):
    import json

    c = sync_client
    assert c.install_queue_storage() is None  # migrates (idempotent)
    assert c.flush_admin_metadata() is None
    status = json.loads(c.storage_status())
    assert status["current_engine"] == status["active_engine"] == "awa_fast"
    assert status["state"] == "active" and status["can_finalize"] is False
    assert status["details"]["migration_version"] == awa.current_migration_version()
    for key in (
        "prepared_engine",
        "transition_epoch",
        "entered_at",
        "finalize_blockers",
        "canonical_live_backlog",
        "live_runtime_capability_counts",
    ):
        assert key in status
    # another schema: created, and the client moves there (ADR 027)
    c.install_queue_storage(schema="awa_exp")
    assert c.schema == "awa_exp"
    assert json.loads(c.storage_status())["details"]["schema"] == "awa_exp"
    job = c.insert({"n": 1}, kind="in_exp")
    assert [j.id for j in c.list_jobs(kind="in_exp")] == [job.id]


def test_insert_many_copy_per_job_opts(sync_client):
    c = sync_client
    jobs = c.insert_many_copy(
        [{"i": 0}, {"i": 1}, {"i": 2}],
        kind="copy_k",
        queue="base",
        ordering_key="batch",
        opts=[None, {"queue": "other"}, {"ordering_key": None, "queue": "x"}],
    )
    assert [j.queue for j in jobs] == ["base", "other", "x"]
    with pytest.raises(awa.ValidationError, match="opts length must match jobs length"):
        c.insert_many_copy([{"i": 0}], kind="copy_k", opts=[])
    with pytest.raises(awa.ValidationError, match="unsupported opts key 'priority'"):
        c.insert_many_copy([{"i": 0}], kind="copy_k", opts=[{"priority": 1}])
    with pytest.raises(awa.ValidationError, match="dict or None"):
        c.insert_many_copy([{"i": 0}], kind="copy_k", opts=["q"])
    assert c.enqueue_many_copy([{"i": 5}], kind="copy_k", opts=[{"queue": "y"}]) == 1
    assert [j.queue for j in c.list_jobs(queue="y")] == ["y"]


def test_enqueue_many_copy_stripes(sync_client):
    assert (
        sync_client.enqueue_many_copy([{"i": 1}], kind="copy_s", queue_storage_queue_stripe_count=1)
        == 1
    )
    # awa's stripes: accepted without effect (tests/compat/test_storage_options_inapplicable.py)
    assert (
        sync_client.enqueue_many_copy([{"i": 2}], kind="copy_s", queue_storage_queue_stripe_count=2)
        == 1
    )
    with pytest.raises(awa.ValidationError, match="queue_storage_queue_stripe_count must be > 0"):
        sync_client.enqueue_many_copy([{"i": 3}], kind="copy_s", queue_storage_queue_stripe_count=0)
