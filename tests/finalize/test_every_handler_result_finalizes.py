"""Issue 9, class 2: nothing a handler produces may keep its attempt from finalizing.

Every test runs without maintenance (no rescue can finalize the attempt for it) and waits on the
runtime's ``wait_attempts_ended`` signal, then asserts the final row: the attempt reached its
real outcome at once, with a stored (sanitized, escaped, bounded) form of what the handler
produced.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math

import psycopg
import pytest

import awa_fast as awa
from awa_fast.worker import storable
from tests import support
from tests.support import Recorder, failing_rows, job_row, poll_until, scalar, wait_state

# The shared timing (tests/support.py) with this module's differences.
FAST = {**support.FAST, "maintenance": False}

pytestmark = pytest.mark.usefixtures("clean")


@dataclasses.dataclass
class Job:
    mode: str = ""


async def _run(client, handler, *modes, max_attempts=3, **start):
    """Register ``handler``, insert one job per mode, run them to their end; returns rows."""
    client.task(Job)(handler)
    jobs = [await client.insert(Job(m), max_attempts=max_attempts) for m in modes]
    await client.start([("default", 8)], **{**FAST, **start})
    await asyncio.wait_for(client.runtime.wait_attempts_ended(len(jobs)), 30)
    return [await job_row(client.database_url, j.id) for j in jobs]


class Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("no str for you")

    def __repr__(self):
        raise RuntimeError("no repr either")


class BadEquality(Exception):
    def __eq__(self, other):
        raise RuntimeError("no eq")

    def __hash__(self):
        raise RuntimeError("no hash")


async def test_class2_nul_in_error_finalizes_at_once(client):
    async def work(job):
        raise ValueError("bad\x00byte")

    (row,) = await _run(client, work, "x", max_attempts=1)
    assert row["state"] == "failed"
    assert row["errors"][-1]["error"].startswith("ValueError: bad\\x00byte")


async def test_class2_lone_surrogate_in_error_is_retried_with_its_real_error(client):
    async def work(job):
        raise RuntimeError("half a pair: \ud800!")

    (row,) = await _run(client, work, "x")
    assert row["state"] == "retryable" and row["attempt"] == 1
    assert "half a pair: \\ud800!" in row["errors"][-1]["error"]


async def test_class2_exception_whose_str_and_repr_raise(client):
    async def work(job):
        raise Unprintable()

    (row,) = await _run(client, work, "x")
    assert row["state"] == "retryable"
    assert row["errors"][-1]["error"].startswith("Unprintable: <unprintable Unprintable>")


async def test_class2_exception_whose_eq_and_hash_raise(client):
    def work(job):  # a def handler: the exception crosses the thread boundary too
        raise BadEquality("odd")

    (row,) = await _run(client, work, "x")
    assert row["state"] == "retryable"
    assert row["errors"][-1]["error"].startswith("BadEquality: odd")


async def test_class2_cancel_reason_with_nul_and_surrogate_cancels(client):
    async def work(job):
        return awa.Cancel("stop\x00now \udc80")

    (row,) = await _run(client, work, "x")
    assert row["state"] == "cancelled"  # not turned into a retry by a failed write
    assert row["errors"][-1]["error"] == "cancelled: stop\\x00now \\udc80"


async def test_class2_cancel_reason_whose_str_raises(client):
    async def work(job):
        return awa.Cancel(Unprintable())

    (row,) = await _run(client, work, "x")
    assert row["state"] == "cancelled"
    assert row["errors"][-1]["error"] == "cancelled: <unprintable Unprintable>"


async def test_class2_huge_error_is_bounded_and_says_so(client):
    async def work(job):
        raise ValueError("x" * 2_000_000)

    (row,) = await _run(client, work, "x", max_attempts=1)
    assert row["state"] == "failed"
    text = row["errors"][-1]["error"]
    assert len(text) < storable.MAX_TEXT_CHARS + 200
    assert f"[truncated: {storable.MAX_TEXT_CHARS} of" in text


async def test_class2_base_exceptions_raised_by_handlers_are_failures(client):
    async def work(job):
        if job.args.mode == "interrupt":
            raise KeyboardInterrupt("from the handler")
        if job.args.mode == "exit":
            raise SystemExit(3)

    rows = await _run(client, work, "interrupt", "exit", "plain")
    assert [r["state"] for r in rows] == ["retryable", "retryable", "completed"]
    assert rows[0]["errors"][-1]["error"].startswith("KeyboardInterrupt: from the handler")
    assert rows[1]["errors"][-1]["error"].startswith("SystemExit: 3")
    # The loop survived: the runtime still claims and completes.
    later = await client.insert(Job("plain"))
    await asyncio.wait_for(client.runtime.wait_attempts_ended(4), 30)
    assert (await job_row(client.database_url, later.id))["state"] == "completed"


async def test_class2_def_handler_raising_system_exit(client):
    def work(job):
        raise SystemExit("thread exit")

    (row,) = await _run(client, work, "x")
    assert row["state"] == "retryable"
    assert row["errors"][-1]["error"].startswith("SystemExit: thread exit")


async def test_class2_def_handler_raising_what_asyncio_cannot_carry_fails_at_once(client):
    # StopIteration and GeneratorExit set on the thread's future never reached the awaiting
    # task: the attempt stayed running until its deadline, or until rescue (breaker helper)
    def work(job):
        if job.args.mode == "stop":
            raise StopIteration("from a def handler")
        raise GeneratorExit("from a def handler")

    rows = await _run(client, work, "stop", "genexit")
    assert [r["state"] for r in rows] == ["retryable", "retryable"]
    assert rows[0]["errors"][-1]["error"].startswith("StopIteration: from a def handler")
    assert rows[1]["errors"][-1]["error"].startswith("GeneratorExit: from a def handler")


class LyingException(Exception):
    @property
    def __class__(self):
        raise RuntimeError("isinstance cannot look at me")


class InterruptingException(Exception):
    @property
    def __class__(self):
        raise KeyboardInterrupt("isinstance interrupted")


@pytest.mark.parametrize("sync", [False, True])
async def test_class2_an_exception_whose_class_lookup_raises_fails_terminally(client, sync):
    def raise_for(mode):
        raise LyingException("x") if mode == "lying" else InterruptingException("y")

    async def async_work(job):
        raise_for(job.args.mode)

    def def_work(job):
        raise_for(job.args.mode)

    rows = await _run(client, def_work if sync else async_work, "lying", "interrupting")
    assert [r["state"] for r in rows] == ["failed", "failed"]
    assert rows[0]["errors"][-1]["error"].startswith("LyingException: x")
    assert rows[1]["errors"][-1]["error"].startswith("InterruptingException: y")
    # the loop survived both
    later = await client.insert(Job("plain"))
    assert (await wait_state(client, later.id, "failed"))["attempt"] == 1


@pytest.mark.parametrize("sync", [False, True])
async def test_class2_unexpected_return_values(client, sync):
    def result(job):
        if job.args.mode == "object":
            return object()
        if job.args.mode == "liar":
            return LyingException("returned, not raised")
        if job.args.mode == "nan-retry":
            r = awa.RetryAfter(1)
            r.seconds = math.nan  # replaced after validation
            return r

    async def work(job):
        return result(job)

    # a def handler's result is mapped the same way (its isawaitable check read __class__)
    rows = await _run(client, result if sync else work, "object", "liar", "nan-retry")
    assert rows[0]["state"] == "completed"  # any value completes (awa's mapping)
    for row in rows[1:]:  # a result that cannot even be inspected fails, with the reason
        assert row["state"] == "failed"
        assert "handler result could not be mapped" in row["errors"][-1]["error"]
        assert row["errors"][-1]["terminal"] is True
    assert "isinstance cannot look at me" in rows[1]["errors"][-1]["error"]
    assert "RetryAfter seconds must be a finite number" in rows[2]["errors"][-1]["error"]


async def test_class2_progress_and_metadata_are_validated_at_the_call(client):
    seen = {}

    async def work(job):
        bad = {
            "nul-message": lambda: job.set_progress(50, "a\x00b"),
            "surrogate-message": lambda: job.set_progress(50, "\ud800"),
            "nul-metadata": lambda: job.update_metadata({"k": "v\x00"}),
            "nul-key": lambda: job.update_metadata({"k\x00": 1}),
            "object": lambda: job.update_metadata({"o": object()}),
            "huge": lambda: job.update_metadata({"big": "x" * 100_000}),
            "nan": lambda: job.update_metadata({"x": [math.nan]}),
        }
        for name, call in bad.items():
            try:
                call()
            except awa.ValidationError as exc:
                seen[name] = (exc.field, exc.limit)
        job.set_progress(40, "fine")
        await job.flush_progress()

    (row,) = await _run(client, work, "x")
    assert set(seen) == {
        "nul-message",
        "surrogate-message",
        "nul-metadata",
        "nul-key",
        "object",
        "huge",
        "nan",
    }
    assert seen["nan"] == ("metadata.x[0]", "a finite number")
    assert seen["nul-message"][0] == "progress.message"
    assert seen["surrogate-message"] == ("progress.message", "JSON")
    assert seen["nul-metadata"][0] == seen["nul-key"][0] == "metadata"
    assert seen["object"] == ("metadata.o", "JSON")  # the field path (ADR 030)
    assert seen["huge"] == ("metadata", f"<= {storable.MAX_PROGRESS_BYTES} bytes")
    assert row["state"] == "completed"


async def test_progress_calls_after_the_handler_returned_raise_as_awa_pg_does(client):
    # they were accepted and dropped without a word (breaker helper); awa-pg raises
    # RuntimeError outside dispatch
    kept = []

    async def work(job):
        job.set_progress(10, "in dispatch")
        kept.append(job)

    (row,) = await _run(client, work, "x")
    assert row["state"] == "completed"
    job = kept[0]
    for call in (
        lambda: job.set_progress(50),
        lambda: job.update_metadata({"k": 1}),
        job.flush_progress_sync,
    ):
        with pytest.raises(RuntimeError, match="handler has returned"):
            call()
    with pytest.raises(RuntimeError, match="handler has returned"):
        await job.flush_progress()


async def test_class2_a_bad_progress_row_does_not_fail_the_batched_heartbeat(dsn, client):
    # A trigger added outside awa-fast refuses one row's progress: the other attempts of the
    # process keep beating and their progress is written; the bad row beats without it.
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("""
            CREATE OR REPLACE FUNCTION public.refuse_poison() RETURNS trigger LANGUAGE plpgsql
            AS $$ BEGIN RAISE EXCEPTION 'poisoned progress refused'; END $$;
            CREATE TRIGGER refuse_poison BEFORE UPDATE ON awa_fast.jobs FOR EACH ROW
                WHEN (NEW.progress->>'message' = 'poison') EXECUTE FUNCTION public.refuse_poison();""")
    started, gate = Recorder(), asyncio.Event()
    try:

        async def work(job):
            job.set_progress(50, job.args.mode)
            started.append(job.id)
            await gate.wait()

        client.task(Job)(work)
        jobs = [await client.insert(Job(m)) for m in ("fine", "poison", "also-fine")]
        # Heartbeats only when the test calls beat().
        await client.start(
            [("default", 8)],
            **{**FAST, "heartbeat_interval_ms": 3_600_000, "heartbeat_staleness_ms": 7_200_000},
        )
        await started.until(lambda: len(started) == 3, what="three handlers running")
        before = await scalar(dsn, "SELECT max(heartbeat_at) FROM awa_fast.jobs_all")
        hb = client.runtime.heartbeat
        await hb.beat()
        rows = [await job_row(dsn, j.id) for j in jobs]
        assert [r["progress"] and r["progress"].get("message") for r in rows] == [
            "fine",
            None,
            "also-fine",
        ]
        assert all(r["heartbeat_at"] > before for r in rows)  # the bad row beat too
        assert hb.progress_dropped == 1
        await hb.beat()  # dropped: the next beat is a plain batch again
        assert hb.progress_dropped == 1
        gate.set()
        await asyncio.wait_for(client.runtime.wait_attempts_ended(3), 30)
        assert {(await job_row(dsn, j.id))["state"] for j in jobs} == {"completed"}
    finally:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute(
                "DROP TRIGGER refuse_poison ON awa_fast.jobs; DROP FUNCTION public.refuse_poison()"
            )


@pytest.fixture
async def failing_completion(dsn):
    """A trigger that fails the statement completing a job of kind ``job`` in mode 'boom' (a
    completion writes the finished row into awa_fast.jobs_done, ADR 016)."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("""
            CREATE OR REPLACE FUNCTION public.fail_completion() RETURNS trigger
            LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'completion refused by trigger'; END $$;
            CREATE TRIGGER fail_completion BEFORE INSERT ON awa_fast.jobs_done FOR EACH ROW
                WHEN (NEW.state = 'completed' AND NEW.args->>'mode' = 'boom')
                EXECUTE FUNCTION public.fail_completion();""")
    yield
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(
            "DROP TRIGGER fail_completion ON awa_fast.jobs_done; "
            "DROP FUNCTION public.fail_completion()"
        )


@pytest.mark.usefixtures("failing_completion")
async def test_class2_non_retryable_finalize_error_records_a_prompt_failure(client):
    async def work(job):  # a plain completion: the compact path
        return None

    rows = await _run(client, work, "boom", "ok")
    assert rows[1]["state"] == "completed"
    row = rows[0]
    assert row["state"] == "retryable" and row["attempt"] == 1  # at once, not at rescue
    assert "finalize failed" in row["errors"][-1]["error"]
    assert "completion refused by trigger" in row["errors"][-1]["error"]
    assert client.runtime.finalizer.stats["prompt_failures"] == 1


@pytest.mark.usefixtures("failing_completion")
async def test_class2_prompt_failure_on_the_final_attempt_fails_the_job(client):
    async def work(job):
        job.enqueue_on_completion(Job("child"))  # the per-job path this time

    (row,) = await _run(client, work, "boom", max_attempts=1)
    assert row["state"] == "failed"
    assert "completion refused by trigger" in row["errors"][-1]["error"]
    assert (
        await scalar(
            client.database_url,
            "SELECT count(*) FROM awa_fast.jobs_all WHERE args->>'mode' = 'child'",
        )
        == 0
    )


@dataclasses.dataclass
class Compensated:
    job_id: int


@pytest.mark.usefixtures("failing_completion")
@pytest.mark.parametrize("settle_fails", [False, True])
async def test_class2_prompt_failure_on_the_final_attempt_fires_exhausted_specs_once(
    dsn, client, settle_fails
):
    # The completion statement fails (a trigger): the final attempt is failed by prompt
    # failure. Through the failure path (settle_fails=False), or -- when a second trigger also
    # fails the settlement -- through the rescue-shaped fallback that leaves the job
    # consequence_pending for the reconciler: either way its exhausted spec fires exactly once.
    client.on_exhausted_enqueue(Job, lambda args, j, error, attempt: Compensated(j.id))

    async def work(job):
        return None

    async def compensations():
        return await scalar(
            dsn, "SELECT count(*) FROM awa_fast.jobs_all WHERE kind = 'compensated'"
        )

    async with (
        failing_rows(
            dsn,
            "NEW.state = 'failed' AND NEW.args->>'mode' = 'boom'",
            event="UPDATE",
            name="fail_settle",
        )
        if settle_fails
        else contextlib.nullcontext()
    ):
        (row,) = await _run(client, work, "boom", max_attempts=1, consequence_backoff_ms=1)
        if settle_fails:
            assert row["state"] == "consequence_pending"  # the fallback: owed its settlement
            await client.runtime.reconcile()  # still refused: backed off, nothing inserted
            assert await compensations() == 0
    if settle_fails:
        # polled: each try runs one reconcile pass by hand; the owed settlement's backoff
        # (consequence_backoff_ms) is time passing
        await poll_until(lambda: _settled(client, row["id"]), what="the reconciler's settlement")
    row = await job_row(dsn, row["id"])
    assert row["state"] == "failed" and row["attempt"] == 1
    assert "completion refused by trigger" in " ".join(e["error"] for e in row["errors"])
    await client.runtime.reconcile()  # settled once: nothing more
    assert await compensations() == 1
    assert await scalar(
        dsn, "SELECT args->>'job_id' FROM awa_fast.jobs_all WHERE kind = 'compensated'"
    ) == str(row["id"])


async def _settled(client, job_id: int) -> bool:
    await client.runtime.reconcile()
    return (await job_row(client.database_url, job_id))["state"] == "failed"


@dataclasses.dataclass
class Restart:
    n: int = 0


@pytest.mark.parametrize("mode", ["fast", "immediate"])  # immediate: crash recovery
async def test_class2_finalize_across_a_server_restart_gets_a_live_connection(own_server, mode):
    # Every pooled connection dies with the restart. The finalize that follows once spent its
    # retries in milliseconds on them, then (with the finalizer's pool check and back-off) one
    # retry; now the pool (connections.Pool) never hands out a connection the server closed,
    # and it finalizes on its first try.
    c = awa.AsyncClient(own_server.awa_dsn, max_connections=10)
    try:
        gate, started = asyncio.Event(), asyncio.Event()

        @c.task(Restart)
        async def work(job):
            started.set()
            await gate.wait()
            job.enqueue_on_completion(Restart(job.args.n + 1))  # the per-job path

        async with (await c.pool()).connection() as conn:
            await conn.execute("TRUNCATE awa_fast.jobs")
        first = await c.insert(Restart(0), max_attempts=1)
        # Nothing else touches the pool meanwhile: no polling claims, no heartbeats.
        await c.start(
            [("default", 4)],
            poll_interval_ms=3_600_000,
            heartbeat_interval_ms=3_600_000,
            heartbeat_staleness_ms=7_200_000,
            maintenance=False,
        )
        await started.wait()
        pool = await c.pool()
        held = [pool.connection() for _ in range(8)]  # fill the pool: 8 idle connections
        await asyncio.gather(*(h.__aenter__() for h in held))
        for h in held:
            await h.__aexit__(None, None, None)
        await asyncio.to_thread(own_server.restart, mode)
        gate.set()
        await asyncio.wait_for(c.runtime.wait_attempts_ended(1), 60)
        row = await job_row(own_server.awa_dsn, first.id)
        assert row["state"] == "completed"
        assert c.runtime.finalizer.stats["retries"] == 0
        assert pool.closed_by_server >= 1  # passed, not handed to the finalize
        assert (
            await scalar(
                own_server.awa_dsn,
                "SELECT count(*) FROM awa_fast.jobs_all WHERE (args->>'n')::int = 1",
            )
            == 1
        )
    finally:
        await c.close()


async def test_class2_callback_payloads_and_errors_cannot_wedge_a_wait(dsn, client):
    issued = asyncio.Queue()

    async def work(job):
        token = await job.register_callback(timeout_seconds=60)
        await issued.put(token.id)
        if job.args.mode == "resume":
            return {"got": await job.wait_for_callback(token)}
        return awa.WaitForCallback(token)

    client.task(Job)(work)
    resumed = await client.insert(Job("resume"))
    await client.start([("default", 1)], **FAST)
    token = await issued.get()
    await wait_state(client, resumed.id, "waiting_external")
    with pytest.raises(awa.ValidationError) as exc:  # typed, at the call; nothing changes
        await client.resume_external(token, {"text": "a\x00b"})
    assert exc.value.field == "payload"
    with pytest.raises(awa.SerializationError):
        await client.resume_external(token, {"obj": object()})
    assert (await job_row(dsn, resumed.id))["state"] == "waiting_external"
    await client.resume_external(token, {"text": "fine"})
    await wait_state(client, resumed.id, "completed")

    parked = await client.insert(Job("park"), max_attempts=1)
    token = await issued.get()
    await wait_state(client, parked.id, "waiting_external")
    await client.fail_external(token, "external \x00 failure \ud800")  # stored escaped
    row = await wait_state(client, parked.id, "failed")
    assert "external \\x00 failure \\ud800" in row["errors"][-1]["error"]


async def test_class2_retries_exhausted_record_a_prompt_failure(dsn, client):
    # Every completion of this job deadlocks (a trigger raising SQLSTATE 40P01 on the finished
    # row's insert, ADR 016): the retries back off, are spent, and the attempt is failed at
    # once with the error.
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute("""
            CREATE OR REPLACE FUNCTION public.always_deadlock() RETURNS trigger LANGUAGE plpgsql
            AS $$ BEGIN RAISE EXCEPTION 'simulated deadlock' USING ERRCODE = 'deadlock_detected';
            END $$;
            CREATE TRIGGER always_deadlock BEFORE INSERT ON awa_fast.jobs_done FOR EACH ROW
                WHEN (NEW.state = 'completed' AND NEW.args->>'mode' = 'stuck')
                EXECUTE FUNCTION public.always_deadlock();""")
    try:

        async def work(job):
            job.enqueue_on_completion(Job("child"))

        (row,) = await _run(client, work, "stuck")
        assert row["state"] == "retryable" and row["attempt"] == 1
        assert "finalize failed: DeadlockDetected: simulated deadlock" in row["errors"][-1]["error"]
        stats = client.runtime.finalizer.stats
        assert stats["retries"] >= 3 and stats["prompt_failures"] == 1
    finally:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute(
                "DROP TRIGGER always_deadlock ON awa_fast.jobs_done; "
                "DROP FUNCTION public.always_deadlock()"
            )
