"""awa's durable batch operations (ADR-030) on a real PostgreSQL: the filter and spec rules,
preview (eligible rows only, sample by id), submit, the leader's runner (scan freezes the
membership; chunks account each item once as processed / skipped / errored; a row that fails
alone is errored with last_error and the rest proceed), cooperative cancel, purge, the sync
twins, and an operation run to completion by a real maintenance leader."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

import awa_fast as awa
from awa_fast import batch_ops
from awa_fast.sync_client import Client
from tests.support import failing_rows, job_row, passes, scalar, until

pytestmark = pytest.mark.usefixtures("clean")


@dataclasses.dataclass
class Item:
    n: int = 0


async def _run_to_end(dsn, op_id: str, steps: int = 50) -> dict:
    """Run the leader's runner step by step (each its own transaction) until the operation is
    finalized; returns it."""
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        for _ in range(steps):
            async with conn.transaction():
                await batch_ops.run_once(conn, "test-runner")
            op = await batch_ops.get(conn, op_id)
            if op["finalized_at"] is not None:
                return op
    raise AssertionError(f"operation {op_id} did not finish in {steps} steps")


@pytest.mark.parametrize(
    "call, field",
    [
        (lambda c: c.preview_batch_operation("delete_all", spec={}), "op_kind"),
        (lambda c: c.preview_set_priority(9), "priority"),
        (lambda c: c.preview_move_queue("", filter={"queue": "a"}), "queue"),
        (lambda c: c.preview_set_priority(1, filter={"colour": "red"}), "filter"),
        (lambda c: c.preview_set_priority(1, filter={"state": "sleeping"}), "state"),
        (
            lambda c: c.preview_set_priority(1, filter={"created_at_lt": "yesterday"}),
            "created_at_lt",
        ),
        (lambda c: c.set_priority(1), "filter"),  # every queued job: needs allow_all=True
        (lambda c: c.get_batch_operation("not-a-uuid"), "operation_id"),
        (lambda c: c.list_batch_operations(state="dozing"), "state"),
    ],
)
async def test_bad_operations_are_validation_errors(client, call, field):
    with pytest.raises(awa.ValidationError) as info:
        await call(client)
    assert info.value.field == field
    assert await client.list_batch_operations() == []


async def test_a_submit_without_filter_says_it_requires_a_filter_or_allow_all(client):
    # awa's words: "requires a filter or allow_all"; nothing is submitted
    for call in (lambda: client.set_priority(1), lambda: client.move_queue("elsewhere")):
        with pytest.raises(awa.ValidationError, match="requires a filter or allow_all=True"):
            await call()
    assert await client.list_batch_operations() == []


async def test_preview_submit_run_set_priority(dsn, client):
    queued = [await client.insert(Item(i), queue="bq", priority=3) for i in range(5)]
    later = await client.insert(
        Item(9), queue="bq", priority=3, run_at=datetime.now(UTC) + timedelta(hours=1)
    )
    other = await client.insert(Item(8), queue="elsewhere", priority=3)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(
            "UPDATE awa_fast.jobs SET state = 'running', run_lease = 1, attempt = 1 WHERE id = %s",
            (queued[0].id,),
        )  # not eligible
    preview = await client.preview_set_priority(1, filter={"queue": "bq"})
    assert preview["total_matched"] == 5  # 4 available + 1 scheduled; the running one is not
    assert [r["id"] for r in preview["sample"]] == [j.id for j in queued[1:]] + [later.id]

    op = await client.set_priority(1, filter={"queue": "bq"}, submitted_by="ops@example.com")
    assert op["state"] == "pending" and op["op_kind"] == "set_priority"
    assert op["spec"] == {"priority": 1} and op["submitted_by"] == "ops@example.com"
    assert [o["id"] for o in await client.list_batch_operations(state="pending")] == [op["id"]]
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        async with conn.transaction():
            await batch_ops.run_once(conn, "r")  # scan: membership frozen
    # claimed between scan and apply: skipped, not changed
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(
            "UPDATE awa_fast.jobs SET state = 'running', run_lease = 1, attempt = 1 WHERE id = %s",
            (queued[1].id,),
        )
    done = await _run_to_end(dsn, op["id"])
    assert (
        done["state"],
        done["total_matched"],
        done["processed"],
        done["skipped"],
        done["errored"],
    ) == ("completed", 5, 4, 1, 0)
    assert done["retention_until"] is not None and done["started_at"] is not None
    for job in queued[2:] + [later]:
        assert (await job_row(dsn, job.id))["priority"] == 1
    for job in (queued[0], queued[1], other):
        assert (await job_row(dsn, job.id))["priority"] == 3
    assert (await job_row(dsn, later.id))["state"] == "scheduled"


async def test_move_queue_a_failing_row_is_errored_and_the_rest_move(dsn, client):
    jobs = [
        await client.insert(Item(i), queue="from_q", priority=2, tags=["acme"]) for i in range(4)
    ]
    untagged = await client.insert(Item(7), queue="from_q")
    op = await client.move_queue("to_q", priority=4, filter={"tag": "acme", "queue": "from_q"})
    async with failing_rows(
        dsn, f"OLD.id = {jobs[2].id} AND NEW.queue = 'to_q'", event="UPDATE", name="no_move"
    ):
        done = await _run_to_end(dsn, op["id"])
    assert (done["state"], done["processed"], done["skipped"], done["errored"]) == (
        "completed",
        3,
        0,
        1,
    )
    assert done["last_error"].startswith(f"job {jobs[2].id}:")
    for job in jobs[:2] + jobs[3:]:
        row = await job_row(dsn, job.id)
        assert (row["queue"], row["priority"]) == ("to_q", 4)
        assert row["metadata"]["_awa_original_queue"] == "from_q"
    assert (await job_row(dsn, jobs[2].id))["queue"] == "from_q"
    assert (await job_row(dsn, untagged.id))["queue"] == "from_q"
    assert await scalar(
        dsn,
        "SELECT array_agg(state ORDER BY job_id) FROM "
        "awa_fast.batch_operation_items WHERE operation_id = %s",
        (op["id"],),
    ) == ["processed", "processed", "errored", "processed"]


async def test_cancel_and_purge(dsn, client):
    for i in range(3):
        await client.insert(Item(i), queue="cq")
    pending = await client.set_priority(4, filter={"queue": "cq"})
    # awa's lifecycle: a cancel asks (cancelling); the runner's next step finalizes it
    cancelling = await client.cancel_batch_operation(pending["id"])
    assert cancelling["state"] == "cancelling" and cancelling["finalized_at"] is None
    cancelled = await _run_to_end(dsn, pending["id"])
    assert cancelled["state"] == "cancelled" and cancelled["finalized_at"] is not None
    with pytest.raises(awa.JobNotFound):
        await client.cancel_batch_operation(pending["id"])  # finished already

    active = await client.set_priority(4, filter={"queue": "cq"})
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        async with conn.transaction():
            await batch_ops.run_once(conn, "r")  # scanned, now running
    assert (await client.cancel_batch_operation(active["id"]))["state"] == "cancelling"
    done = await _run_to_end(dsn, active["id"])
    assert done["state"] == "cancelled" and done["processed"] == 0  # stopped before a chunk
    assert await scalar(dsn, "SELECT count(*) FROM awa_fast.jobs_all WHERE priority = 4") == 0

    assert await client.purge_batch_operations(datetime.now(UTC) - timedelta(days=1)) == 0
    assert await client.purge_batch_operations(datetime.now(UTC) + timedelta(seconds=1)) == 2
    with pytest.raises(awa.JobNotFound):
        await client.get_batch_operation(active["id"])


async def test_the_leader_runs_it_and_the_sync_twins(dsn, client):
    for i in range(3):
        await client.insert(Item(i), queue="lq", priority=4)

    @client.task(Item, queue="lq_idle")
    async def item(job):
        return None

    await client.start([("lq_idle", 1)], leader_election_interval_ms=100, poll_interval_ms=50)
    sync = Client(dsn)
    try:
        assert sync.preview_set_priority(2, filter={"queue": "lq"})["total_matched"] == 3
        op = sync.set_priority(2, filter={"queue": "lq"})

        async def finished():
            found = await client.get_batch_operation(op["id"])
            return found if found["state"] == "completed" else None

        done = await until(
            finished, passes(client, "run_batch_operations"), what="the leader to run the operation"
        )
        assert done["processed"] == 3
        assert sync.get_batch_operation(op["id"])["state"] == "completed"
        assert [o["id"] for o in sync.list_batch_operations()] == [op["id"]]
        assert (
            await scalar(
                dsn, "SELECT count(*) FROM awa_fast.jobs_all WHERE queue = 'lq' AND priority = 2"
            )
            == 3
        )
    finally:
        sync.close()
        await client.shutdown()


async def test_cli_batch_ops(dsn, client):
    from tests.cli.test_cli import cli, ok_json

    for i in range(2):
        await client.insert(Item(i), queue="cliq", priority=3)
    found = ok_json(
        "batch-ops",
        "preview",
        "--op-kind",
        "set_priority",
        "--spec",
        '{"priority": 1}',
        "--filter",
        '{"queue": "cliq"}',
        dsn=dsn,
    )
    assert found["total_matched"] == 2
    refused = cli(
        "batch-ops", "submit", "--op-kind", "set_priority", "--spec", '{"priority": 1}', dsn=dsn
    )
    # a usage error naming the command's own flags (not the Python keyword allow_all)
    assert refused.returncode == 2 and "give --filter, or --all" in refused.stderr
    op = ok_json(
        "batch-ops",
        "submit",
        "--op-kind",
        "move_queue",
        "--spec",
        '{"queue": "q2"}',
        "--filter",
        '{"queue": "cliq"}',
        "--submitted-by",
        "cli-test",
        dsn=dsn,
    )
    assert op["state"] == "pending" and op["submitted_by"] == "cli-test"
    assert [o["id"] for o in ok_json("batch-ops", "list", dsn=dsn)] == [op["id"]]
    assert ok_json("batch-ops", "cancel", op["id"], dsn=dsn)["state"] == "cancelling"
    await _run_to_end(dsn, op["id"])  # the leader's runner finalizes it
    assert ok_json("batch-ops", "get", op["id"], dsn=dsn)["state"] == "cancelled"
    assert ok_json("batch-ops", "purge", "--before", "2999-01-01T00:00:00Z", dsn=dsn) == {
        "purged": 1
    }
    bad = cli("batch-ops", "preview", "--op-kind", "set_priority", "--spec", "{oops", dsn=dsn)
    assert bad.returncode == 1 and "--spec is not JSON" in bad.stderr
