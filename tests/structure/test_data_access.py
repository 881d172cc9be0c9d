"""The data-access boundary (ADR 034): statements run in the repositories of ``awa_fast/repo/``,
which return named rows; a converted module neither calls ``.execute`` nor reads a row by
position, and no new module starts talking to the database directly.

Counted on the source (no database): a call ``x.execute(...)`` / ``x.executemany(...)``, and a
subscript by an integer literal (``row[3]``, ``found[-1]``). A converted module's count is
zero but for the subscripts listed with their reason; every other module that executes is
listed in ``NOT_YET`` (by path prefix: a module split into a folder stays covered) with the
reason it is not converted yet. The named rows are checked against their statements' columns
on a real server."""

from __future__ import annotations

import ast
import uuid
from pathlib import Path

import psycopg
import pytest

from awa_fast import sql
from awa_fast.job import JOB_FIELDS
from awa_fast.repo import RowShapeError, named
from awa_fast.repo.attempts import AttemptRepo
from awa_fast.repo.batch_ops import BatchRepo
from awa_fast.repo.callbacks import CallbackRepo, StillRunning
from awa_fast.repo.consequences import ConsequenceRepo, LockedJob
from awa_fast.repo.cron import CronRepo
from awa_fast.repo.dashboard import DashboardRepo
from awa_fast.repo.dlq import DlqRepo
from awa_fast.repo.hand import HandRepo
from awa_fast.repo.isolated import (
    DISCARD_FAILED,
    DLQ_MOVE,
    DLQ_PURGE,
    DLQ_RETRY,
    DRAIN_QUEUE,
    RETRY_FAILED,
    IsolatedRepo,
)
from awa_fast.repo.jobs import JobRepo
from awa_fast.repo.leadership import LeaderRepo
from awa_fast.repo.maintenance import PassRepo
from awa_fast.repo.queues import QueueRepo
from awa_fast.repo.stats import StatsRepo
from awa_fast.repo.storage import StorageRepo
from awa_fast.repo.verify import VerifyRepo
from awa_fast.repo.workers import WorkerRepo

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "awa_fast"

# Below or beside the boundary: they are where statements run, or what connections are made of.
LAYER = {
    "awa_fast/repo/": "the repositories themselves",
    "awa_fast/sql/": "statement text only",
    "awa_fast/schema/": "the migration runner: DDL and its version bookkeeping, below the data",
    "awa_fast/pg_connection.py": "makes the connections repositories run on (session settings)",
    "awa_fast/pooler.py": "connection setup: detects a pooler on a new connection",
    "awa_fast/connections.py": "connection setup: the pools and their session checks",
    "awa_fast/embedded/": "the embedded server's bootstrap (CREATE DATABASE), not queue data",
    "awa_fast/worker/sync_effect.py": "a connection itself: the blocking view an effect gets",
    "awa_fast/bridge.py": "inserts through the caller's own driver (asyncpg, SQLAlchemy, Django)",
}

# Modules converted: no .execute; integer subscripts only these, each for a reason.
CONVERTED: dict[str, dict[str, str]] = {
    "awa_fast/worker/consequences.py": {"errors[-1]": "the last error entry of a job's list"},
    "awa_fast/callbacks.py": {},
    "awa_fast/batch_ops.py": {"ids[-1]": "the chunk's last job id (the operation's cursor)"},
    "awa_fast/periodic.py": {"fires[-1]": "the latest of the fire times just enqueued"},
    "awa_fast/descriptors.py": {},
    "awa_fast/wake.py": {},
    "awa_fast/worker/reconcile.py": {},
    "awa_fast/worker/aging.py": {},
    "awa_fast/worker/idle_poll.py": {},
    "awa_fast/worker/runtime.py": {},
    "awa_fast/worker/attempts.py": {},
    "awa_fast/worker/presence.py": {},
    "awa_fast/worker/listener.py": {},
    "awa_fast/worker/leader_tasks.py": {},
    "awa_fast/worker/shutdown.py": {},
    "awa_fast/worker/heartbeat.py": {},
    "awa_fast/worker/lingering.py": {},
    "awa_fast/worker/context.py": {},
    "awa_fast/worker/maintenance/__init__.py": {},
    "awa_fast/worker/maintenance/config.py": {},
    "awa_fast/worker/maintenance/leader.py": {},
    "awa_fast/worker/maintenance/passes.py": {},
    "awa_fast/worker/maintenance/promote.py": {},
    "awa_fast/worker/maintenance/prune.py": {},
    "awa_fast/worker/maintenance/rescue.py": {},
    "awa_fast/worker/maintenance/scheduler.py": {},
    "awa_fast/worker/maintenance/service.py": {},
    "awa_fast/worker/maintenance/vacuum.py": {},
    "awa_fast/metrics.py": {
        "series[0]": "the cached (counter, histogram) pair of a finalize: per job, a tuple",
        "series[1]": "the cached (counter, histogram) pair of a finalize: per job, a tuple",
    },
    "awa_fast/admin/area.py": {},
    "awa_fast/admin/batches.py": {},
    "awa_fast/admin/callbacks.py": {},
    "awa_fast/admin/consequences.py": {},
    "awa_fast/admin/cron.py": {},
    "awa_fast/admin/dlq.py": {},
    "awa_fast/admin/health.py": {},
    "awa_fast/admin/jobs.py": {"entries[-1]": "the latest error entry of the attempt dumped"},
    "awa_fast/admin/queues.py": {},
    "awa_fast/admin/storage.py": {},
    "awa_fast/client.py": {},
    "awa_fast/sync_client.py": {},
    "awa_fast/web/reads.py": {"rows[-1]": "a page's last row, whose id is the next page's cursor"},
    "awa_fast/raw_client.py": {},
    "awa_fast/testing.py": {
        "raised[-1]": "the last exception the handler raised (awa's WorkResult.error)",
        'outcome.error["error"].splitlines()[0]': "the first line of a failure's error text",
    },
}

# Not converted yet, with the reason; path prefixes.
NOT_YET = {
    "awa_fast/cli": "the CLI moves to a command table (issue 30)",
    "awa_fast/worker/dispatcher.py": "the claim: its rows decode straight into JobContext "
    "(a tuple-speed hot path)",
    "awa_fast/worker/finalizer.py": "compact completions are the hot path (tuple rows kept); "
    "its failure path uses ConsequenceRepo",
    "awa_fast/enqueue.py": "the insert path (hot: one round trip per insert kept as is): next",
    "awa_fast/producer.py": "the producer's flush (hot path): next",
    "awa_fast/transaction.py": "the caller's own statement text (awa's Transaction.execute / "
    "fetch_*) and the COMMIT / ROLLBACK of the BEGIN producer.py sends: with the producer",
    "awa_fast/demo/": "the demo's own tables and reads",
}


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _listed(rel: str, table: dict[str, str]) -> str | None:
    return next((prefix for prefix in table if rel.startswith(prefix)), None)


def _counts(path: Path) -> tuple[list[int], list[str]]:
    """Line numbers of ``.execute`` / ``.executemany`` calls, and the source of each
    integer-literal subscript."""
    source = path.read_text()
    executes, subscripts = [], []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ("execute", "executemany")
        ):
            executes.append(node.lineno)
        if isinstance(node, ast.Subscript):
            index = node.slice
            if isinstance(index, ast.UnaryOp) and isinstance(index.op, ast.USub):
                index = index.operand
            if isinstance(index, ast.Constant) and type(index.value) is int:
                subscripts.append(ast.get_source_segment(source, node) or "?")
    return executes, subscripts


@pytest.mark.parametrize("rel", sorted(CONVERTED))
def test_a_converted_module_runs_no_statement_and_reads_no_column_by_position(rel):
    executes, subscripts = _counts(ROOT / rel)
    assert executes == [], f"{rel} calls .execute on lines {executes}: use a repository"
    allowed = CONVERTED[rel]
    assert sorted(subscripts) == sorted(allowed), (
        f"{rel} reads by position {sorted(subscripts)}; allowed {sorted(allowed)}: "
        "return a named row from the repository"
    )


def test_every_module_that_runs_statements_is_a_repository_or_listed():
    unlisted = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = _rel(path)
        executes, _ = _counts(path)
        if executes and not (_listed(rel, LAYER) or _listed(rel, NOT_YET) or rel in CONVERTED):
            unlisted[rel] = executes
    assert unlisted == {}, (
        f"modules calling .execute outside awa_fast/repo/ (lines): {unlisted}; add the "
        "statements to a repository (or list the module in NOT_YET with its reason)"
    )


def test_the_lists_name_modules_that_exist():
    for table in (LAYER, CONVERTED, NOT_YET):
        for prefix in table:
            assert any(_rel(p).startswith(prefix) for p in PACKAGE.rglob("*.py")), prefix


REPO_MAY_IMPORT = ("awa_fast.sql", "awa_fast.job", "awa_fast.rows", "awa_fast.repo")


@pytest.mark.parametrize("path", sorted((PACKAGE / "repo").glob("*.py")), ids=lambda p: p.name)
def test_a_repository_imports_only_statements_rows_and_repositories(path):
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("awa_fast"):
            found |= {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("awa_fast")}
    wrong = sorted(m for m in found if not m.startswith(REPO_MAY_IMPORT))
    assert wrong == [], f"{_rel(path)} imports {wrong}: a repository sits below the domain"


def test_the_count_sees_what_it_should(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(
        "async def f(conn, row, found):\n"
        "    await conn.execute('x')\n"
        "    conn.cursor().executemany('y', [])\n"
        "    return row[3], found[-1], row.id, row[i]\n"
    )
    executes, subscripts = _counts(probe)
    assert sorted(executes) == [2, 3]
    assert subscripts == ["row[3]", "found[-1]"]


def test_the_locked_row_is_the_lock_statements_columns():
    columns = tuple(c.strip() for c in f"{sql.JOB_COLUMNS}, {sql.CONSEQUENCE_COLUMNS}".split(","))
    assert LockedJob._fields == columns
    assert LockedJob._fields[: len(JOB_FIELDS)] == JOB_FIELDS


async def test_a_named_row_checks_the_statements_columns(dsn):
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = conn.cursor(row_factory=named(StillRunning))
        await cur.execute("SELECT 7 AS id, now() AS heartbeat_at")
        row = await cur.fetchone()
        assert row is not None and row.id == 7 and row == (7, row.heartbeat_at)
        with pytest.raises(RowShapeError, match="heartbeat_at"):
            await cur.execute("SELECT 7 AS id, now() AS seen_at")
        # the repositories' statements: no such job, and each result's shape is checked
        assert await CallbackRepo(conn).lock(uuid.uuid4()) is None
        assert await CallbackRepo(conn).still_running(uuid.uuid4(), 1000) is None
        assert await ConsequenceRepo(conn).lock_running(0, 0) is None
        assert await ConsequenceRepo(conn).lock_owed(0) is None
        assert await CronRepo(conn).lock("no such schedule") is None
        assert await CronRepo(conn).scan() == []
        assert await BatchRepo(conn).next() is None
        assert await BatchRepo(conn).apply([0], {"priority": None, "queue": None}) == []
        match = dict.fromkeys(("f_kind", "f_queue", "f_ids", "f_tag", "f_state", "f_gte", "f_lt"))
        assert await BatchRepo(conn).preview(match, 1) == []
        verify = VerifyRepo(conn)
        async with conn.transaction(force_rollback=True):
            changes = await verify.sync_kinds(["k"], 60.0)
            # unsettled: read before this statement's own change
            assert (changes.added, changes.dropped, changes.unsettled) == (["k"], [], False)
            await verify.mark_changes()
            assert [s.kind for s in await verify.settled_changes()] in ([], ["k"])
        assert await verify.due(["k"], 60.0, 1) == []
        assert await StatsRepo(conn).queue_depth() == []
        assert await WorkerRepo(conn).unhandled(["no such queue"]) == []
        attempts = AttemptRepo(conn)
        assert await attempts.register_callback(0, 0, 60.0, None) is None
        assert await attempts.parked(0) is None
        passes = PassRepo(conn)
        assert (await passes.hot_table()) is not None
        async with conn.transaction(force_rollback=True):
            params = {
                "stale_ms": 1000,
                "limit": 1,
                "consequence_kinds": [],
                "known_kinds": [],
                "only": 0,
                "own": [],
            }
            assert await passes.rescued(sql.RESCUE, params) == []
            assert await passes.rescued(sql.RESCUE_CALLBACKS, params) == []
            assert await LeaderRepo(conn).fence(-1) is False
        assert tuple(await StatsRepo(conn).consequence_counts()) == (0, 0)


async def test_the_admin_repositories_rows_are_their_statements_columns(dsn):
    """Each admin statement run once (no such job: every result is empty, its shape checked)."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        jobs, dlq, queues = JobRepo(conn), DlqRepo(conn), QueueRepo(conn)
        assert await jobs.get(0) is None
        assert await jobs.newest("failed", "no such kind", None, 1) == []
        assert await jobs.retry(0, 1000) is None
        assert await jobs.attempt_still_runs(0, 1000) is None
        assert await jobs.cancel(0) is None
        assert await jobs.live_with_unique_key(b"no such key") is None
        assert await jobs.failed_matching("no such kind", None, 1000) == 0
        assert await jobs.dump(0) is None
        match = dict.fromkeys(("kind", "queue", "tag", "before_id", "before_dlq_at"))
        assert await dlq.newest({**match, "kind": "no such kind"}, 1) == []
        assert await dlq.get(0) is None
        assert await dlq.depth("no such queue") == 0
        assert "no such queue" not in await dlq.depth_by_queue()
        retry = {"id": 0, "run_at": None, "priority": None, "to_queue": None, "stale_ms": 1000}
        assert await dlq.retry(retry) is None
        assert await dlq.attempt_still_runs(0, 1000) is None
        assert await dlq.move(0, "manual") is False
        assert await dlq.purge(0) is False
        assert await dlq.dump(0) is None
        assert all(
            s.total_queued == s.scheduled + s.available + s.retryable for s in await queues.stats()
        )
        assert [u for u in await queues.unhandled() if u.queue == "no such queue"] == []
        assert await queues.available(["no such queue"]) == {}
        assert [o for o in await ConsequenceRepo(conn).owed(1) if o.id == 0] == []
        history = await StorageRepo(conn).history()
        assert history.version is not None and history.first_at <= history.last_at
        nothing = {"kind": "no such kind", "queue": "no such queue", "stale_ms": 1000}
        operations = {
            RETRY_FAILED: nothing,
            DISCARD_FAILED: nothing,
            DRAIN_QUEUE: {"queue": "no such queue"},
            DLQ_RETRY: {**match, **retry, "kind": "no such kind"},
            DLQ_MOVE: {**nothing, "reason": "manual"},
            DLQ_PURGE: {**match, "kind": "no such kind"},
        }
        assert await HandRepo(conn).claim("no such queue", "no such kind") is None
        assert await HandRepo(conn).job_row(0) is None
        async with conn.transaction(force_rollback=True):
            for operation, params in operations.items():
                repo = IsolatedRepo(conn, operation, params)
                assert (await repo.bulk(), await repo.ids(), await repo.one(0)) == ([], [], [])


async def test_the_dashboards_reads_run_with_the_statement_timeout_and_give_dict_rows(dsn):
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        async with conn.transaction():
            reads = DashboardRepo(conn)
            await reads.limit_statement_time()
            timeout = await (await conn.execute("SHOW statement_timeout")).fetchone()
            assert timeout == ("5s",)
            bounds = await reads.id_bounds()
            assert set(bounds) == {"min", "max"}
            assert isinstance(await reads.queue_depth(), list)
            assert isinstance(await reads.queue_recent(0), list)
            assert isinstance(await reads.queue_meta(), list)
            assert await reads.job_page({"queue": None, "kind": None, "state": None}, 0, 0) == []
            assert await reads.job(0) is None and await reads.dlq_job(0) is None
            assert await reads.job_summary(0) is None
            assert await reads.job_children(0) == []
            assert await reads.dlq_page("no such queue", None, 2**63 - 1) == []
            assert set(await reads.consequence_counts()) == {"owed", "overdue"}
            assert isinstance(await reads.consequences_owed(), list)
            assert isinstance(await reads.consequences_applied(0), list)
            assert await reads.leader(0) is None
            assert (await reads.leader_lease()) is None or "epoch" in (await reads.leader_lease())
            assert isinstance(await reads.presence(), list)
            assert isinstance(await reads.connections(), list)
            assert await reads.running_count() >= 0
            assert isinstance(await reads.running(), list)
        # SET LOCAL: the session's own setting is back once the transaction ends
        assert await (await conn.execute("SHOW statement_timeout")).fetchone() != ("5s",)
