"""Every dashboard statement reads through an index, never a sequential scan of the job table,
with a large finished history (200k finished rows in the slices of awa_fast.jobs_done, ADR
016, a small active set; the slices never analyzed, then analyzed from 300 rows) --
the way test_schema checks the claim path. Statements are EXPLAINed with their parameters bound,
as the dashboard runs them (no server-side prepared statements: custom plans)."""

from __future__ import annotations

import psycopg
import pytest

from awa_fast import sql
from awa_fast.sql import dashboard as dq

FINISHED = 200_000


@pytest.fixture(scope="module", params=["slices never analyzed", "slices analyzed"])
def history(request, dsn):
    """The module database filled: 200k finished jobs over 3 queues and 20 kinds (1 % failed,
    1 % cancelled; every 100th staged by the job before it; every 500th with an applied
    consequence), a few hundred active rows in each active state, owed consequences, 5k DLQ
    rows. Returns ``(dsn, newest_id)``.

    Twice: as a slice autovacuum has not analyzed yet, then as it leaves them (300 rows,
    migration 017)."""
    analyzed = request.param == "slices analyzed"
    with psycopg.connect(dsn, autocommit=True) as conn:
        if conn.execute("SELECT count(*) FROM awa_fast.jobs_done").fetchone()[0]:
            conn.execute("ANALYZE awa_fast.jobs_done")
            return dsn, conn.execute("SELECT max(id) FROM awa_fast.jobs_all").fetchone()[0]
        conn.execute(f"""
            INSERT INTO awa_fast.jobs_done (id, kind, queue, state, attempt, run_at, created_at,
                                            finalized_at, metadata, consequence_state,
                                            consequence_applied_at)
            SELECT nextval('awa_fast.jobs_id_seq'), 'kind_' || (g % 20), 'q' || (g % 3),
                   (CASE WHEN g % 100 = 7 THEN 'failed' WHEN g % 100 = 8 THEN 'cancelled'
                         ELSE 'completed' END)::awa_fast.job_state,
                   1, now() - interval '1 day', now() - interval '1 day', now() - interval '1 hour',
                   CASE WHEN g % 100 = 0 THEN jsonb_build_object('awa:triggered_by', g - 1)
                        ELSE '{{}}'::jsonb END,
                   CASE WHEN g % 500 = 7 THEN 'applied' END,
                   CASE WHEN g % 500 = 7 THEN now() - interval '1 hour' END
            FROM generate_series(1, {FINISHED}) g""")
        conn.execute("""
            INSERT INTO awa_fast.jobs (kind, queue, state, run_at, heartbeat_at, attempt,
                                       consequence_state, consequence_retry_at)
            SELECT 'kind_' || (g % 20), 'q' || (g % 3), s.state::awa_fast.job_state,
                   CASE WHEN s.state IN ('scheduled', 'retryable') THEN now() + interval '1 hour'
                        ELSE now() END,
                   CASE WHEN s.state = 'running' THEN now() END, 1,
                   CASE WHEN s.state = 'consequence_pending' THEN 'owed' END,
                   CASE WHEN s.state = 'consequence_pending' THEN now() END
            FROM generate_series(1, 200) g,
                 unnest(ARRAY['available', 'scheduled', 'retryable', 'running', 'waiting_external',
                              'consequence_pending']) AS s(state)""")
        conn.execute("""
            INSERT INTO awa_fast.dlq (id, kind, queue, state, dlq_reason, original_run_lease)
            SELECT 10000000 + g, 'kind_' || (g % 20), 'q' || (g % 3), 'failed', 'exhausted', 1
            FROM generate_series(1, 5000) g""")
        conn.execute("ANALYZE awa_fast.jobs")
        conn.execute("ANALYZE awa_fast.dlq")
        if analyzed:
            conn.execute("ANALYZE awa_fast.jobs_done")
        newest = conn.execute("SELECT max(id) FROM awa_fast.jobs_all").fetchone()[0]
    return dsn, newest


def plan_of(dsn: str, statement: str, params: dict | None = None) -> str:
    with psycopg.connect(dsn, autocommit=True, prepare_threshold=None) as conn:
        # Only where no index can serve a relation does a Seq Scan remain: the hot table is
        # small (its active set) and most slices are empty, so costs alone would pick one.
        conn.execute("SET enable_seqscan = off")
        return "\n".join(r[0] for r in conn.execute("EXPLAIN " + statement, params))


def window(newest: int) -> dict:
    return {"before": newest + 1, "floor": newest + 1 - dq.SCAN_WINDOW_IDS, "limit": dq.PAGE_ROWS}


def cases(newest: int) -> dict[str, tuple[str, dict | None]]:
    none = {"queue": None, "kind": None, "state": None}
    sample = {"floor": newest - dq.SAMPLE_IDS + 1}
    return {
        "id bounds": (dq.ID_BOUNDS, None),
        "queue depth": (dq.QUEUE_DEPTH, None),
        "queue recent": (dq.QUEUE_RECENT, sample),
        "jobs, no filter": (dq.JOB_PAGE, {**none, **window(newest)}),
        "jobs, failed": (dq.JOB_PAGE, {**none, "state": "failed", **window(newest)}),
        "jobs, running": (dq.JOB_PAGE, {**none, "state": "running", **window(newest)}),
        "jobs, queue+kind": (
            dq.JOB_PAGE,
            {**none, "queue": "q1", "kind": "kind_4", **window(newest)},
        ),
        "jobs, unknown kind": (dq.JOB_PAGE, {**none, "kind": "nope", **window(newest)}),
        "jobs, older page": (
            dq.JOB_PAGE,
            {**none, "state": "cancelled", **window(newest - 120_000)},
        ),
        "job detail": (dq.JOB_DETAIL, {"id": 12345}),
        "dlq detail": (dq.DLQ_DETAIL, {"id": 10000007}),
        "job summary": (dq.JOB_SUMMARY, {"id": 12345}),
        "follow-ups": (dq.JOB_CHILDREN, {"id": 12399, "limit": dq.CHILD_ROWS}),
        "dlq page": (
            dq.DLQ_PAGE,
            {"queue": "q2", "kind": None, "before": 10005001, "limit": dq.PAGE_ROWS},
        ),
        "dlq page, kind": (
            dq.DLQ_PAGE,
            {"queue": None, "kind": "kind_3", "before": 10004001, "limit": dq.PAGE_ROWS},
        ),
        "consequence counts": (dq.CONSEQUENCE_COUNTS, None),
        "consequences owed": (dq.CONSEQUENCES_OWED, {"limit": dq.OWED_ROWS}),
        "consequences applied": (dq.CONSEQUENCES_APPLIED, {**sample, "limit": dq.PAGE_ROWS}),
        "running count": (dq.RUNNING_COUNT, None),
        "running": (dq.RUNNING, {"limit": dq.RUNNING_ROWS}),
        "leader": (dq.LEADER, {"key": sql.LEADER_LOCK_KEY}),
        "leader lease": (dq.LEADER_LEASE, None),
        "connections": (dq.CONNECTIONS, None),
        "presence": (dq.PRESENCE, {"limit": dq.PRESENCE_ROWS}),
    }


def test_no_dashboard_statement_scans_the_job_table(history):
    dsn, newest = history
    plans = {name: plan_of(dsn, stmt, params) for name, (stmt, params) in cases(newest).items()}
    scans = {
        name: plan
        for name, plan in plans.items()
        if "Seq Scan on jobs" in plan or "Seq Scan on dlq" in plan
    }
    assert not scans, "\n\n".join(f"{name}:\n{plan}" for name, plan in scans.items())
    # the indexes each page is meant to use
    assert "idx_awa_fast_jobs_triggered_by" in plans["follow-ups"], plans["follow-ups"]
    assert "idx_awa_fast_dlq_triggered_by" in plans["follow-ups"], plans["follow-ups"]
    assert "idx_awa_fast_jobs_owed" in plans["consequences owed"], plans["consequences owed"]
    assert "idx_awa_fast_jobs_claim" in plans["queue depth"], plans["queue depth"]
    assert "idx_awa_fast_jobs_running" in plans["running"], plans["running"]
    for name in ("jobs, no filter", "jobs, unknown kind", "queue recent", "job detail"):
        assert "jobs_pkey" in plans[name], f"{name}:\n{plans[name]}"


def test_the_job_list_is_keyset_paged(history):
    """No OFFSET and no count over the table in any dashboard statement."""
    dsn, newest = history
    for name, (stmt, _) in cases(newest).items():
        assert "OFFSET" not in stmt.upper(), name
    assert "count(" not in dq.JOB_PAGE and "count(" not in dq.DLQ_PAGE
