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
from awa_fast.repo.leadership import LeaderRepo
from awa_fast.repo.maintenance import PassRepo
from awa_fast.repo.stats import StatsRepo
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
}

# Not converted yet, with the reason; path prefixes.
NOT_YET = {
    "awa_fast/admin/": "the admin areas are being merged into one surface (issue 30); next",
    "awa_fast/client.py": "the facade is being reworked (issue 30, one admin surface)",
    "awa_fast/sync_client.py": "the facade is being reworked (issue 30, one admin surface)",
    "awa_fast/raw_client.py": "the facade is being reworked (issue 30, one admin surface)",
    "awa_fast/cli": "the CLI moves to a command table (issue 30)",
    "awa_fast/web/": "web/reads.py is the dashboard's read model already (dict rows, a statement "
    "timeout per transaction); it moves under repo/ next",
    "awa_fast/worker/dispatcher.py": "the claim: its rows decode straight into JobContext "
    "(a tuple-speed hot path)",
    "awa_fast/worker/finalizer.py": "compact completions are the hot path (tuple rows kept); "
    "its failure path uses ConsequenceRepo",
    "awa_fast/enqueue.py": "the insert path (hot: one round trip per insert kept as is): next",
    "awa_fast/producer.py": "the producer's flush (hot path): next",
    "awa_fast/transaction.py": "the caller-owned transaction wrapper: next",
    "awa_fast/testing.py": "AwaTestClient drives one job by hand: next",
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
