"""Producer paths and admin basics against a real PostgreSQL: AsyncClient / Client, insert,
insert_many, insert_many_copy, transactions, the bridge, derive_kind, get/list/retry/cancel,
queue_stats and pause/resume.
"""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import UTC, datetime, timedelta, timezone

import msgspec
import psycopg
import pytest
from psycopg.rows import dict_row

import awa_fast
from awa_fast import EnqueueRequest, JobState, derive_kind
from awa_fast.bridge import insert_job, insert_job_sync
from tests.support import poll_until, wakeups_until_marker

UTC = UTC


# -- args types -------------------------------------------------------------------------------


@dataclasses.dataclass
class SendEmail:
    to: str
    subject: str = "hi"


class OAuthRefresh(msgspec.Struct):
    user_id: int
    scopes: list[str] = []


class SMTPEmail:
    """A pydantic-style model: only ``model_dump(mode=...)``."""

    dump_modes: list = []

    def __init__(self, host: str, sent_at: datetime):
        self.host = host
        self.sent_at = sent_at

    def model_dump(self, mode: str = "python") -> dict:
        SMTPEmail.dump_modes.append(mode)
        sent = self.sent_at.isoformat() if mode == "json" else self.sent_at
        return {"host": self.host, "sent_at": sent}


@dataclasses.dataclass
class PDFRenderJob:
    doc: int


# -- fixtures and helpers ---------------------------------------------------------------------


@pytest.fixture(autouse=True)
def clean(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET lock_timeout = '5s'")
        conn.execute("CREATE TABLE IF NOT EXISTS side_effects (note text NOT NULL)")
        conn.execute("TRUNCATE awa_fast.jobs, awa_fast.queue_meta, side_effects")


@pytest.fixture(scope="module")
async def client(dsn):
    async with awa_fast.AsyncClient(dsn, max_connections=10) as c:
        yield c


@pytest.fixture(scope="module")
def sync_client(dsn):
    with awa_fast.Client(dsn, max_connections=3) as c:
        yield c


def q(dsn: str, query: str, params=None) -> list[dict]:
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
        return conn.execute(query, params).fetchall()


def count(dsn: str, where: str = "true", params=None) -> int:
    return q(dsn, f"SELECT count(*) AS n FROM awa_fast.jobs_all WHERE {where}", params)[0]["n"]


def side_count(dsn: str) -> int:
    return q(dsn, "SELECT count(*) AS n FROM side_effects")[0]["n"]


def ts(value: str) -> datetime:
    return datetime.fromisoformat(value)


# -- derive_kind ------------------------------------------------------------------------------

GOLDEN = [
    ("SendEmail", "send_email"),
    ("SMTPEmail", "smtp_email"),
    ("OAuthRefresh", "o_auth_refresh"),
    ("PDFRenderJob", "pdf_render_job"),
    ("ProcessV2Import", "process_v2_import"),
    ("ReconcileQ3Revenue", "reconcile_q3_revenue"),
    ("HTMLToPDF", "html_to_pdf"),
    ("IOError", "io_error"),
]


@pytest.mark.parametrize("name, kind", GOLDEN)
def test_derive_kind_golden(name, kind):
    assert derive_kind(name) == kind


# -- clients and insert -----------------------------------------------------------------------


async def test_async_client_insert_returns_job_with_all_fields(dsn):
    run_at = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=2)
    async with awa_fast.AsyncClient(dsn, max_connections=10) as c:
        job = await c.insert(
            SendEmail(to="a@example.com"),
            queue="mail",
            priority=1,
            max_attempts=7,
            tags=["t1", "t2"],
            metadata={"trace": {"id": "abc"}},
            run_at=run_at,
            unique_opts={"by_queue": True},
            ordering_key="tenant-1",
        )
        fetched = await c.get_job(job.id)
    assert isinstance(job, awa_fast.Job)
    assert job.kind == "send_email"
    assert job.queue == "mail"
    assert job.args == {"to": "a@example.com", "subject": "hi"}
    assert job.priority == 1
    assert job.max_attempts == 7
    assert job.tags == ["t1", "t2"]
    assert job.metadata == {"trace": {"id": "abc"}}
    assert ts(job.run_at) == run_at
    assert job.state == JobState.Scheduled
    assert job.attempt == 0
    assert job.unique_states == 31 and len(job.unique_key) == 16
    assert job.to_dict() == fetched.to_dict()
    (r,) = q(dsn, "SELECT * FROM awa_fast.jobs_all")
    assert r["id"] == job.id and r["state"] == "scheduled" and r["run_at"] == run_at
    assert bytes(r["ordering_key"]) == b"tenant-1"


async def test_insert_defaults(client, dsn):
    before = datetime.now(UTC)
    job = await client.insert({"a": 1}, kind="plain")
    assert (job.kind, job.queue, job.priority, job.max_attempts) == ("plain", "default", 2, 25)
    assert job.tags == [] and job.metadata == {} and job.args == {"a": 1}
    assert job.state == JobState.Available
    assert job.unique_key is None and job.unique_states is None
    assert before - timedelta(seconds=5) < ts(job.run_at) < datetime.now(UTC) + timedelta(seconds=5)
    assert ts(job.created_at) == ts(job.run_at)
    (r,) = q(dsn, "SELECT ordering_key, state::text FROM awa_fast.jobs_all")
    assert r == {"ordering_key": None, "state": "available"}


def test_sync_client_context_manager(dsn):
    with awa_fast.Client(dsn) as c:
        job = c.insert(PDFRenderJob(doc=3), tags=("x",), ordering_key=b"\x01\x02")
        assert job.kind == "pdf_render_job" and job.args == {"doc": 3} and job.tags == ["x"]
        assert c.get_job(job.id).to_dict() == job.to_dict()
        assert [j.id for j in c.list_jobs(kind="pdf_render_job")] == [job.id]
    assert (
        bytes(q(dsn, "SELECT ordering_key FROM awa_fast.jobs_all")[0]["ordering_key"])
        == b"\x01\x02"
    )


async def test_args_types_and_kind_derivation(client, dsn):
    SMTPEmail.dump_modes.clear()
    sent = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    jobs = [
        await client.insert(SendEmail(to="x")),
        await client.insert(OAuthRefresh(user_id=9, scopes=["r"])),
        await client.insert(SMTPEmail("smtp.local", sent)),
        await client.insert({"free": "form"}, kind="custom_kind"),
        await client.insert(SendEmail(to="y"), kind="override"),
    ]
    assert SMTPEmail.dump_modes == ["json"]
    got = [(j.kind, j.args) for j in jobs]
    assert got == [
        ("send_email", {"to": "x", "subject": "hi"}),
        ("o_auth_refresh", {"user_id": 9, "scopes": ["r"]}),
        ("smtp_email", {"host": "smtp.local", "sent_at": sent.isoformat()}),
        ("custom_kind", {"free": "form"}),
        ("override", {"to": "y", "subject": "hi"}),
    ]
    stored = {
        r["id"]: (r["kind"], r["args"])
        for r in q(dsn, "SELECT id, kind, args FROM awa_fast.jobs_all")
    }
    assert stored == {j.id: (j.kind, j.args) for j in jobs}


@pytest.mark.parametrize(
    "delta, state",
    [
        (timedelta(hours=1), JobState.Scheduled),
        (timedelta(days=365 * 50), JobState.Scheduled),
        # awa-pg: any explicit run_at, even past, makes the job scheduled (promotion follows)
        (timedelta(seconds=-1), JobState.Scheduled),
        (timedelta(days=-3650), JobState.Scheduled),
    ],
)
async def test_run_at_decides_state(client, dsn, delta, state):
    run_at = datetime.now(UTC) + delta
    job = await client.insert({"d": str(delta)}, kind="timed", run_at=run_at)
    assert job.state == state
    assert ts(job.run_at) == run_at
    assert q(dsn, "SELECT state::text AS s FROM awa_fast.jobs_all")[0]["s"] == str(state)


async def test_run_at_string_future_is_scheduled(client):
    future = (datetime.now(UTC) + timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    past = (datetime.now(UTC) - timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%S")
    assert (await client.insert({}, kind="s", run_at=future)).state == JobState.Scheduled
    assert (await client.insert({}, kind="s", run_at=past)).state == JobState.Scheduled


# -- insert_many ------------------------------------------------------------------------------


async def test_insert_many_in_order_with_shared_options(client, dsn):
    jobs = await client.insert_many(
        [{"i": i} for i in range(300)],
        kind="bulk",
        queue="b",
        priority=3,
        tags=["x", "y,z"],
        metadata={"m": 1},
    )
    assert [j.args["i"] for j in jobs] == list(range(300))
    assert len({j.id for j in jobs}) == 300
    assert all(
        j.kind == "bulk"
        and j.queue == "b"
        and j.priority == 3
        and j.tags == ["x", "y,z"]
        and j.metadata == {"m": 1}
        and j.state == JobState.Available
        for j in jobs
    )
    rows = {r["id"]: r for r in q(dsn, "SELECT id, args, tags, priority FROM awa_fast.jobs_all")}
    assert len(rows) == 300
    for j in jobs:
        assert rows[j.id]["args"] == j.args and rows[j.id]["tags"] == ["x", "y,z"]


async def test_insert_many_mixed_requests_and_tags(client, dsn):
    future = datetime.now(UTC) + timedelta(hours=1)
    jobs = await client.insert_many(
        [
            SendEmail(to="a"),
            EnqueueRequest(
                {"k": 1}, kind="req", queue="other", priority=4, tags=["only"], run_at=future
            ),
            EnqueueRequest(OAuthRefresh(user_id=1), tags=[]),
        ]
    )
    assert [(j.kind, j.queue, j.priority, j.tags, j.state) for j in jobs] == [
        ("send_email", "default", 2, [], JobState.Available),
        ("req", "other", 4, ["only"], JobState.Scheduled),
        ("o_auth_refresh", "default", 2, [], JobState.Available),
    ]
    for j in jobs:
        assert (await client.get_job(j.id)).to_dict() == j.to_dict()


async def test_insert_many_empty(client, dsn):
    assert await client.insert_many([], kind="x") == []
    assert await client.insert_many_copy([], kind="x") == []
    assert count(dsn) == 0


# -- insert_many_copy -------------------------------------------------------------------------


async def test_insert_many_copy_10k(client, dsn):
    n = 10_000
    jobs = await client.insert_many_copy(
        [{"i": i, "s": f"v\t{i}\\n"} for i in range(n)],
        kind="copied",
        queue="copyq",
        tags=["a b", "{c}"],
        metadata={"src": "copy"},
    )
    assert len(jobs) == n
    assert count(dsn) == n
    rows = q(dsn, "SELECT id, (args->>'i')::int AS i, args->>'s' AS s FROM awa_fast.jobs_all")
    assert sorted(j.id for j in jobs) == sorted(r["id"] for r in rows)
    by_id = {r["id"]: r for r in rows}
    for i, j in enumerate(jobs):
        assert by_id[j.id]["i"] == i and j.args["i"] == i
        assert by_id[j.id]["s"] == f"v\t{i}\\n"
    for j in jobs[:: n // 25] + [jobs[-1]]:
        assert (await client.get_job(j.id)).to_dict() == j.to_dict()


async def test_insert_many_copy_options_match_get_job(client, dsn):
    future = datetime(2040, 1, 1, 12, 30, tzinfo=timezone(timedelta(hours=2)))
    past = datetime(2001, 1, 1, tzinfo=UTC)
    jobs = await client.insert_many_copy(
        [
            EnqueueRequest(
                {"a": 1},
                kind="c1",
                run_at=future,
                priority=1,
                max_attempts=3,
                unique_opts={"by_period": 7},
            ),
            EnqueueRequest({"a": 2}, kind="c2", run_at=past, ordering_key="ok"),
            {"a": 3},
        ],
        kind="c3",
        metadata={"x": [1, 2]},
    )
    assert [j.state for j in jobs] == [JobState.Scheduled, JobState.Scheduled, JobState.Available]
    assert ts(jobs[0].run_at) == future and ts(jobs[1].run_at) == past
    for j in jobs:
        assert (await client.get_job(j.id)).to_dict() == j.to_dict()
    assert (
        q(dsn, "SELECT count(*) AS n FROM awa_fast.jobs_all WHERE ordering_key = 'ok'::bytea")[0][
            "n"
        ]
        == 1
    )


async def test_insert_many_copy_run_at_matches_get_job_on_non_utc_session(dsn):
    tz_dsn = psycopg.conninfo.make_conninfo(dsn, options="-c TimeZone=Europe/Berlin")
    run_at = datetime(2040, 1, 1, tzinfo=UTC)
    async with awa_fast.AsyncClient(tz_dsn, max_connections=2) as c:
        inserted = await c.insert({"a": 0}, kind="tz", run_at=run_at)
        (copied,) = await c.insert_many_copy([{"a": 1}], kind="tz", run_at=run_at)
        fetched = await c.get_job(copied.id)
    assert ts(inserted.run_at) == ts(copied.run_at) == run_at
    assert copied.run_at == fetched.run_at
    assert copied.run_at == inserted.run_at


def test_sync_insert_many_and_copy(sync_client, dsn):
    a = sync_client.insert_many([{"i": i} for i in range(5)], kind="sync_many")
    b = sync_client.insert_many_copy([{"i": i} for i in range(5, 10)], kind="sync_many")
    assert [j.args["i"] for j in a + b] == list(range(10))
    assert count(dsn, "kind = 'sync_many'") == 10


# -- transactions -----------------------------------------------------------------------------


async def test_transaction_commits_with_caller_statements(client, dsn):
    async with await client.transaction() as tx:
        assert await tx.execute("INSERT INTO side_effects (note) VALUES ($1)", "created") == 1
        job = await tx.insert({"order": 1}, kind="tx_job")
        many = await tx.insert_many([{"order": 2}, {"order": 3}], kind="tx_job")
        row = await tx.fetch_one(
            "SELECT count(*) AS n FROM awa_fast.jobs_all WHERE kind = $1", "tx_job"
        )
        assert row["n"] == 3
        pct = await tx.fetch_one("SELECT $1::text || '%' AS v, 'a%b' LIKE 'a%' AS m", "50")
        assert pct == {"v": "50%", "m": True}
        # Not visible outside the transaction before commit.
        assert count(dsn) == 0 and side_count(dsn) == 0
    assert count(dsn) == 3 and side_count(dsn) == 1
    assert {j.id for j in [job, *many]} == {
        r["id"] for r in q(dsn, "SELECT id FROM awa_fast.jobs_all")
    }


async def test_transaction_exception_rolls_back_everything(client, dsn):
    with pytest.raises(RuntimeError, match="boom"):
        async with await client.transaction() as tx:
            await tx.execute("INSERT INTO side_effects (note) VALUES ($1)", "lost")
            await tx.insert({"order": 1}, kind="tx_job")
            await tx.insert_many([{"order": 2}], kind="tx_job")
            raise RuntimeError("boom")
    assert count(dsn) == 0 and side_count(dsn) == 0
    # The connection went back to the pool in a usable state.
    assert (await client.insert({"after": True}, kind="tx_job")).state == JobState.Available
    assert count(dsn) == 1


async def test_transaction_explicit_rollback_and_closed(client, dsn):
    tx = await client.transaction()
    await tx.insert({"x": 1}, kind="tx_job")
    await tx.rollback()
    with pytest.raises(awa_fast.AwaError):
        await tx.insert({"x": 2}, kind="tx_job")
    assert count(dsn) == 0
    tx = await client.transaction()
    await tx.insert({"x": 3}, kind="tx_job")
    await tx.commit()
    assert count(dsn) == 1


def test_sync_transaction_commit_and_rollback(sync_client, dsn):
    with sync_client.transaction() as tx:
        tx.execute("INSERT INTO side_effects (note) VALUES ($1)", "sync")
        job = tx.insert({"s": 1}, kind="sync_tx")
        assert count(dsn) == 0
    assert sync_client.get_job(job.id).args == {"s": 1}
    assert side_count(dsn) == 1
    with pytest.raises(KeyError):
        with sync_client.transaction() as tx:
            tx.execute("INSERT INTO side_effects (note) VALUES ($1)", "sync-lost")
            tx.insert({"s": 2}, kind="sync_tx")
            tx.insert_many([{"s": 3}, {"s": 4}], kind="sync_tx")
            raise KeyError("abort")
    assert count(dsn) == 1 and side_count(dsn) == 1


# -- bridge -----------------------------------------------------------------------------------


async def test_bridge_insert_job_joins_caller_transaction(dsn):
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        await conn.execute("INSERT INTO side_effects (note) VALUES ('bridge')")
        out = await insert_job(conn, SendEmail(to="b"), queue="bq", priority=3, tags=["t"])
        assert isinstance(out, dict)
        assert (out["kind"], out["queue"], out["priority"], out["state"], out["tags"]) == (
            "send_email",
            "bq",
            3,
            "available",
            ["t"],
        )
        assert count(dsn) == 0  # uncommitted
        await conn.rollback()
        assert count(dsn) == 0 and side_count(dsn) == 0
        out = await insert_job(conn, {"kind": "from_key", "v": 1})
        await conn.execute("INSERT INTO side_effects (note) VALUES ('bridge')")
        await conn.commit()
    (r,) = q(dsn, "SELECT id, kind, args FROM awa_fast.jobs_all")
    assert r == {"id": out["id"], "kind": "from_key", "args": {"kind": "from_key", "v": 1}}
    assert side_count(dsn) == 1


def test_bridge_insert_job_sync_joins_caller_transaction(dsn):
    with psycopg.connect(dsn) as conn:
        out = insert_job_sync(conn, {"v": 1}, kind="bridged", run_at=datetime(2099, 1, 1))
        assert out["state"] == "scheduled" and out["kind"] == "bridged"
        assert count(dsn) == 0
        conn.rollback()
        assert count(dsn) == 0
        with conn.transaction():
            out = insert_job_sync(conn, {"v": 2}, kind="bridged")
        assert count(dsn) == 1
        with pytest.raises(ZeroDivisionError):
            with conn.transaction():
                insert_job_sync(conn, {"v": 3}, kind="bridged")
                1 / 0
        conn.commit()
    assert [r["id"] for r in q(dsn, "SELECT id FROM awa_fast.jobs_all")] == [out["id"]]


async def test_bridge_rejects_wrong_connection_type(dsn):
    with psycopg.connect(dsn) as sync_conn:
        with pytest.raises(TypeError):
            await insert_job(sync_conn, {"v": 1}, kind="x")
    async with await psycopg.AsyncConnection.connect(dsn) as async_conn:
        with pytest.raises(TypeError):
            insert_job_sync(async_conn, {"v": 1}, kind="x")
    assert count(dsn) == 0


def test_bridge_with_dict_row_connection(dsn):
    with psycopg.connect(dsn, row_factory=dict_row) as conn:
        out = insert_job_sync(conn, {"v": 1}, kind="dict_rows")
        conn.commit()
    assert out["kind"] == "dict_rows" and out["args"] == {"v": 1}


# -- admin ------------------------------------------------------------------------------------


async def test_get_job_missing_raises_awa_error(client, sync_client):
    with pytest.raises(awa_fast.AwaError, match="987654321"):
        await client.get_job(987654321)
    with pytest.raises(awa_fast.JobNotFound):
        sync_client.get_job(987654321)


async def test_list_jobs_filters(client, dsn):
    a = await client.insert({"n": 1}, kind="alpha", queue="q1")
    b = await client.insert({"n": 2}, kind="beta", queue="q1")
    c = await client.insert(
        {"n": 3}, kind="alpha", queue="q2", run_at=datetime.now(UTC) + timedelta(hours=1)
    )
    d = await client.insert({"n": 4}, kind="alpha", queue="q1")
    await client.cancel(d.id)
    ids = lambda jobs: [j.id for j in jobs]
    assert ids(await client.list_jobs()) == [d.id, c.id, b.id, a.id]
    assert ids(await client.list_jobs(kind="alpha")) == [d.id, c.id, a.id]
    assert ids(await client.list_jobs(queue="q1")) == [d.id, b.id, a.id]
    assert ids(await client.list_jobs(state="scheduled")) == [c.id]
    assert ids(await client.list_jobs(state=JobState.Cancelled)) == [d.id]
    assert ids(await client.list_jobs(state="available", kind="alpha", queue="q1")) == [a.id]
    assert ids(await client.list_jobs(limit=2)) == [d.id, c.id]
    assert await client.list_jobs(kind="nope") == []


async def test_cancel_and_retry(client, dsn):
    job = await client.insert({"n": 1}, kind="adm")
    cancelled = await client.cancel(job.id)
    assert cancelled.id == job.id and cancelled.state == JobState.Cancelled
    assert cancelled.finalized_at is not None
    assert (await client.get_job(job.id)).state == JobState.Cancelled
    assert await client.cancel(job.id) is None  # already terminal
    assert await client.cancel(123456789) is None

    retried = await client.retry(job.id)
    assert retried.state == JobState.Available and retried.attempt == 0
    assert retried.finalized_at is None
    assert await client.retry(job.id) is None  # available: not retryable

    failed = await client.insert({"n": 2}, kind="adm")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE awa_fast.jobs SET state = 'failed', attempt = 5, "
            "finalized_at = now() WHERE id = %s",
            (failed.id,),
        )
    r = await client.retry(failed.id)
    assert (r.state, r.attempt) == (JobState.Available, 0)
    row = q(dsn, "SELECT state::text, attempt FROM awa_fast.jobs_all WHERE id = %s", (failed.id,))[
        0
    ]
    assert row == {"state": "available", "attempt": 0}


def test_sync_cancel_and_retry(sync_client):
    job = sync_client.insert({"n": 1}, kind="sync_adm")
    assert sync_client.cancel(job.id).state == JobState.Cancelled
    assert sync_client.retry(job.id).state == JobState.Available


async def test_queue_stats_and_pause_resume(client, dsn):
    now = datetime.now(UTC)
    await client.insert_many([{"i": i} for i in range(3)], kind="st", queue="qa")
    await client.insert({"s": 1}, kind="st", queue="qa", run_at=now + timedelta(hours=1))
    r1 = await client.insert({"r": 1}, kind="st", queue="qb")
    f1 = await client.insert({"f": 1}, kind="st", queue="qb")
    c1 = await client.insert({"c": 1}, kind="st", queue="qb")
    done = await client.insert({"d": 1}, kind="st", queue="qb")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE awa_fast.jobs SET state = 'retryable' WHERE id = %s", (r1.id,))
        conn.execute(
            "UPDATE awa_fast.jobs SET state = 'failed', finalized_at = now() WHERE id = %s",
            (f1.id,),
        )
        conn.execute(
            "UPDATE awa_fast.jobs SET state = 'completed', finalized_at = now() WHERE id = %s",
            (done.id,),
        )
    await client.cancel(c1.id)

    stats = {s.queue: s for s in await client.queue_stats()}
    assert set(stats) == {"qa", "qb"}
    qa, qb = stats["qa"], stats["qb"]
    assert (qa.available, qa.scheduled, qa.retryable, qa.failed, qa.total_queued) == (3, 1, 0, 0, 4)
    assert (qb.available, qb.scheduled, qb.retryable, qb.failed, qb.total_queued) == (0, 0, 1, 1, 1)
    assert (qa.running, qb.running, qb.completed_last_hour, qa.completed_last_hour) == (0, 0, 1, 0)
    assert qa.lag_seconds >= 0 and isinstance(qa.lag_seconds, float)
    assert not qa.paused and not qb.paused

    await client.pause_queue("qa", paused_by="ops")
    await client.pause_queue("empty_q")
    stats = {s.queue: s for s in await client.queue_stats()}
    assert stats["qa"].paused and not stats["qb"].paused
    assert stats["empty_q"].paused and stats["empty_q"].total_queued == 0
    assert (
        q(dsn, "SELECT paused_by FROM awa_fast.queue_meta WHERE queue = 'qa'")[0]["paused_by"]
        == "ops"
    )
    assert stats["qa"].available == 3  # pausing does not change counts

    await client.resume_queue("qa")
    await client.resume_queue("never_seen")  # nothing to resume: not listed afterwards
    stats = {s.queue: s for s in await client.queue_stats()}
    assert not stats["qa"].paused and stats["empty_q"].paused
    assert "never_seen" not in stats


def test_sync_pause_resume(sync_client):
    sync_client.insert({"x": 1}, kind="p", queue="sq")
    sync_client.pause_queue("sq")
    assert {s.queue: s.paused for s in sync_client.queue_stats()} == {"sq": True}
    sync_client.resume_queue("sq")
    assert {s.queue: s.paused for s in sync_client.queue_stats()} == {"sq": False}


# -- wake-ups after commit (ADR 018) ------------------------------------------------------------

_RECORD_NOTIFY_MODE = """
CREATE TABLE IF NOT EXISTS public.insert_notify_mode (queue text, deferred text);
CREATE OR REPLACE FUNCTION public.record_insert_notify_mode() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.insert_notify_mode
    SELECT DISTINCT queue, current_setting('awa_fast.defer_notify', true) FROM new_rows;
    RETURN NULL;
END $$;
CREATE OR REPLACE TRIGGER zz_record_insert_notify_mode AFTER INSERT ON awa_fast.jobs
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION public.record_insert_notify_mode();
"""


@pytest.fixture
async def notify_modes(dsn):
    """Records, per inserting statement, its queues and whether its transaction deferred the
    trigger's NOTIFY (``awa_fast.defer_notify``); yields a reader of the modes for a queue."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(_RECORD_NOTIFY_MODE)

    async def modes(queue: str) -> list[str | None]:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            cur = await conn.execute(
                "SELECT deferred FROM public.insert_notify_mode WHERE queue = %s", (queue,)
            )
            return [r[0] for r in await cur.fetchall()]

    try:
        yield modes
    finally:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute("DROP TRIGGER zz_record_insert_notify_mode ON awa_fast.jobs")


_INSERT_PATHS = {
    "insert": lambda c, q: c.insert(SendEmail("a"), queue=q),
    "insert_many": lambda c, q: c.insert_many([SendEmail("a"), SendEmail("b")], queue=q),
    "insert_many keyed": lambda c, q: c.insert_many(
        [SendEmail("a"), SendEmail("b")], queue=q, unique_opts={}
    ),
    "insert_many_copy": lambda c, q: c.insert_many_copy([SendEmail("a")] * 3, queue=q),
    "insert_many_copy per-job opts": lambda c, q: c.insert_many_copy(
        [SendEmail("a"), SendEmail("b")], queue=q, opts=[{"ordering_key": "x"}, None]
    ),
    "enqueue_many_copy": lambda c, q: c.enqueue_many_copy([SendEmail("a")] * 3, queue=q),
}


@pytest.mark.parametrize("path", sorted(_INSERT_PATHS))
async def test_client_inserts_commit_silently_and_wake_their_queue_after(
    client, dsn, notify_modes, path
):
    # A NOTIFY inside the insert's transaction would take PostgreSQL's notify lock from before
    # its commit until its WAL flush, serializing concurrent producers: the client's own
    # inserts defer it and the producer's waker sends one wake-up once they committed.
    queue = "woken_" + path.replace(" ", "_").replace("-", "_")
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as listener:
        await listener.execute("LISTEN awa_fast")
        sent = client._producer.waker.sent
        await _INSERT_PATHS[path](client, queue)
        await client._producer.waker.flush()
        assert await wakeups_until_marker(listener, dsn, "marker") == [queue]
    assert client._producer.waker.sent == sent + 1
    assert set(await notify_modes(queue)) == {"on"}  # no NOTIFY inside the insert


async def test_scheduled_and_failed_inserts_wake_nothing(client, dsn, notify_modes):
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as listener:
        await listener.execute("LISTEN awa_fast")
        sent = client._producer.waker.sent
        later = datetime.now(UTC) + timedelta(hours=1)
        await client.insert(SendEmail("a"), queue="later", run_at=later)
        await client.insert_many_copy([SendEmail("a")] * 2, queue="later", run_at=later)
        await client.insert(SendEmail("k"), queue="unique_q", unique_opts={})
        await client._producer.waker.flush()
        assert await wakeups_until_marker(listener, dsn, "first") == ["unique_q"]
        with pytest.raises(awa_fast.UniqueConflict):
            await client.insert(SendEmail("k"), queue="unique_q", unique_opts={})
        with pytest.raises(awa_fast.UniqueConflict):  # all or none: nothing committed
            await client.insert_many(
                [SendEmail("new"), SendEmail("k")], queue="unique_q", unique_opts={}
            )
        await client._producer.waker.flush()
        assert await wakeups_until_marker(listener, dsn, "second") == []
    assert client._producer.waker.sent == sent + 1
    assert set(await notify_modes("later")) == {"on"}


async def test_a_transaction_the_caller_ends_notifies_at_its_own_commit(client, dsn, notify_modes):
    # The producer cannot know when a caller's transaction commits: its insert keeps the
    # trigger's NOTIFY, which PostgreSQL delivers at that commit.
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as listener:
        await listener.execute("LISTEN awa_fast")
        sent = client._producer.waker.sent
        async with await client.transaction() as tx:
            await tx.insert(SendEmail("a"), queue="in_tx")
            await tx.insert_many([SendEmail("b")], queue="in_tx")
            assert await wakeups_until_marker(listener, dsn, "before commit") == []
        assert await wakeups_until_marker(listener, dsn, "after commit") == ["in_tx"]
    assert client._producer.waker.sent == sent
    modes = await notify_modes("in_tx")
    assert len(modes) == 2 and "on" not in modes  # unset, or reset to "" at the commit


async def test_a_client_insert_wakes_a_dispatcher_that_polls_once_a_minute(dsn):
    worker = awa_fast.AsyncClient(dsn)
    done = []
    ran = asyncio.Event()

    @worker.task(SendEmail, queue="minute_poll")
    async def send(job):
        done.append(job.id)
        ran.set()

    producer = awa_fast.AsyncClient(dsn)
    try:
        await worker.start([("minute_poll", 1)], poll_interval_ms=60_000)
        job = await producer.insert(SendEmail("a"), queue="minute_poll")
        await asyncio.wait_for(ran.wait(), 30)  # woken by the producer's NOTIFY, not a poll
        assert done == [job.id]
    finally:
        await producer.close()
        await worker.close()


# -- connections the server closed while they sat in the pool --------------------------------------


async def test_inserts_and_reads_after_the_server_closed_the_idle_pool_do_not_fail(dsn, caplog):
    """A server that closes the pool's idle connections (``pg_terminate_backend`` here; a
    restart or an idle timeout does the same) failed the next caller of each one: an insert,
    a handler's own insert, an admin read. The pool passes such a connection instead of handing
    it out, and replaces it (``connections.Pool``)."""
    name = "idle_check_test"
    client = awa_fast.AsyncClient(psycopg.conninfo.make_conninfo(dsn, application_name=name))
    try:
        await client.insert(SendEmail("warm"))
        pool = await client.pool()
        held = [pool.connection() for _ in range(4)]  # four idle connections once given back
        await asyncio.gather(*(h.__aenter__() for h in held))
        for h in held:
            await h.__aexit__(None, None, None)
        await client._producer.waker.flush()
        idle = pool.get_stats()["pool_available"]
        assert idle >= 4, pool.get_stats()  # more than one dead connection to get past
        with psycopg.connect(dsn, autocommit=True) as admin:
            killed = [
                pid
                for pid, ok in admin.execute(
                    "SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name = %s",
                    (name,),
                ).fetchall()
                if ok
            ]
        assert len(killed) >= idle

        async def backends_gone() -> bool:  # server state: a terminated backend exits later
            async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
                cur = await conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", (killed,)
                )
                return (await cur.fetchone())[0] == 0

        await poll_until(backends_gone, what="the terminated backends to exit")
        for i in range(idle + 2):  # each would have met a dead connection
            await client.insert(SendEmail(f"after {i}"))
        assert await client.queue_stats()  # an admin read on the same pool
        await client._producer.waker.flush()
        assert "wake-up NOTIFY" not in caplog.text  # the wake-ups ran on live connections too
        assert pool.closed_by_server >= idle
    finally:
        await client.close()
