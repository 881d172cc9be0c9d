"""Through a real PgBouncer in transaction pooling mode (issue 31, ADR 028): inserts of every
kind, a worker that completes jobs, staged follow-ups and failure consequences, leadership by
the lease (exactly one leader, hand-over on stop and on death, a deposed leader's passes
fenced, next to a directly connected process), wake-ups with and without a direct
``listen_url``, and the misconfigurations refused at start.

PgBouncer is Debian's package (``apt-get install pgbouncer``; ``.ci/run`` installs it): a
missing one fails these tests, never skips them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import subprocess
import sys

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import awa_fast as awa
from awa_fast import sql
from awa_fast.errors import ConfigError
from awa_fast.schema import current_migration_version
from awa_fast.worker.maintenance import Deposed, Maintenance, MaintenanceConfig
from tests.support import (
    FAST,
    job_row,
    poll_until,
    running_bouncer,
    scalar,
    truncate,
    until,
    wait_state,
)

STALE_MS = 600  # the lease tests' heartbeat_staleness_ms: a dead leader's lease expires soon


@pytest.fixture(scope="module")
def bouncer(pg_base_dsn):
    """PgBouncer in transaction pooling mode in front of the test server (stopped afterwards)."""
    with running_bouncer(pg_base_dsn, "transaction") as b:
        yield b


@pytest.fixture(scope="module")
def session_bouncer(pg_base_dsn):
    """PgBouncer in session pooling mode (stopped afterwards)."""
    with running_bouncer(pg_base_dsn, "session") as b:
        yield b


@pytest.fixture
async def pooled(dsn, bouncer):
    """A client whose every pooled connection goes through PgBouncer in transaction mode."""
    await truncate(dsn)
    c = awa.AsyncClient(bouncer.url(dsn), pooler="transaction")
    yield c
    await c.close()


@dataclasses.dataclass
class Item:
    n: int
    mode: str = "ok"


@dataclasses.dataclass
class Next:
    n: int


# -- inserts --------------------------------------------------------------------------------------


async def test_inserts_of_every_kind_through_a_transaction_pooler(dsn, pooled):
    """The issue's first failure: DuplicatePreparedStatement "_pg3_0" on the first insert.
    Enough statements that psycopg would have prepared them (threshold 5) on every client
    connection, over several client connections sharing PgBouncer's server connections."""
    jobs = [await pooled.insert(Item(i)) for i in range(12)]
    many = await pooled.insert_many([Item(100 + i) for i in range(20)])
    copied = await pooled.insert_many_copy([Item(200 + i) for i in range(30)])
    async with await pooled.transaction() as tx:
        inside = await tx.insert(Item(300))
        await tx.insert_many([Item(301), Item(302)])
    async with await pooled.transaction() as tx:
        await tx.insert(Item(400))
        await tx.rollback()

    async def burst(k: int) -> list[int]:  # concurrent: several client connections at once
        return [(await pooled.insert(Item(1000 + k * 10 + i))).id for i in range(8)]

    await asyncio.gather(*(burst(k) for k in range(4)))
    assert len(jobs) == 12 and len(many) == 20 and len(copied) == 30 and inside.id
    assert await scalar(dsn, "SELECT count(*) FROM awa_fast.jobs_all") == 12 + 20 + 30 + 3 + 32
    assert await scalar(dsn, "SELECT count(*) FROM awa_fast.jobs_all WHERE args->>'n' = '400'") == 0


# -- a worker through the pooler --------------------------------------------------------------------


async def test_a_worker_completes_jobs_stages_follow_ups_and_settles_consequences(dsn, pooled):
    released: list[int] = []

    async def release(failure: awa.JobFailure) -> None:
        released.append(failure.id)

    @pooled.task(Next)
    async def next_job(job):
        return None

    @pooled.task(Item, failure_consequence=release)
    async def item(job):
        if job.args.mode == "fail":
            raise awa.TerminalError("declined")
        job.enqueue_on_completion(Next(job.args.n))

    ok = await pooled.insert_many([Item(i) for i in range(40)])
    failing = await pooled.insert(Item(99, "fail"), max_attempts=1)
    await pooled.start([("default", 8)], **{**FAST, "heartbeat_staleness_ms": 2000})
    assert pooled.runtime.maintenance is not None
    for job in ok:
        await wait_state(pooled, job.id, "completed")
    row = await wait_state(pooled, failing.id, "failed")
    await until(lambda: released == [failing.id], pooled, what="the consequence applied")

    async def follow_ups_done():
        return await scalar(
            dsn,
            "SELECT count(*) FROM awa_fast.jobs_all WHERE kind = 'next' AND state = 'completed'",
        )

    await until(lambda: follow_ups_done(), pooled, what="follow-ups completed")
    assert await follow_ups_done() == 40
    row = await wait_state(pooled, failing.id, "failed")
    assert row["consequence_state"] == "applied"
    assert pooled.runtime.maintenance.is_leader  # by the lease, through the pooler
    assert pooled.runtime.listener.conn is None  # no LISTEN through the pool: polling
    # No session advisory lock was taken through PgBouncer (it would stay on a server
    # connection another client gets next).
    assert (
        await scalar(
            dsn,
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 "
            "AND classid = (%s::bigint >> 32)::oid",
            (sql.LEADER_LOCK_KEY,),
        )
        == 0
    )


async def test_heartbeats_on_their_own_connection_through_the_pooler_never_fail(
    dsn, pooled, caplog
):
    """The heartbeat's own connection (ADR 024) goes through the pooler too: a beat psycopg
    had prepared there failed once PgBouncer ran it on another server connection ("prepared
    statement does not exist"), while other clients' statements rotate the server connections."""

    @pooled.task(Item)
    async def item(job):
        beaten = pooled.runtime.heartbeat.beaten
        start = beaten.count
        await beaten.wait_until(lambda: beaten.count >= start + 15, timeout=30)

    job = await pooled.insert(Item(1))
    await pooled.start([("default", 1)], **{**FAST, "maintenance": False})

    async def churn() -> None:  # other client connections' statements, all the while
        while True:
            await asyncio.gather(*(pooled.insert(Item(0), queue="elsewhere") for _ in range(4)))

    churning = asyncio.ensure_future(churn())
    try:
        await wait_state(pooled, job.id, "completed", timeout=60)
    finally:
        churning.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await churning
    failed = [r for r in caplog.records if r.name == "awa_fast.heartbeat" and r.levelno >= 30]
    assert failed == []


async def test_wake_ups_by_polling_without_listen_url(dsn, pooled):
    """Without ``listen_url`` no LISTEN: an idle worker finds a new job by its poll."""

    @pooled.task(Item)
    async def item(job):
        return None

    await pooled.start([("default", 2)], **{**FAST, "maintenance": False})
    assert pooled.runtime.listener.conn is None  # nothing listens through the pool
    idle = pooled.runtime.idle_poll
    await idle.polled.wait_until(lambda: "default" in idle.parked, timeout=15)  # parked, idle
    job = await pooled.insert(Item(1))
    await wait_state(pooled, job.id, "completed")


async def test_a_cancel_without_listen_url_is_kept_when_the_handler_ends(dsn, pooled):
    """What the deployment guide says of polling mode: the cancel request reaches no running
    handler (no LISTEN), and the outcome it returns afterwards is refused: the job stays
    cancelled."""
    started, release = asyncio.Event(), asyncio.Event()
    seen: list[bool] = []

    @pooled.task(Item)
    async def item(job):
        started.set()
        await release.wait()
        seen.append(job.is_cancelled())

    job = await pooled.insert(Item(1))
    await pooled.start([("default", 1)], **{**FAST, "maintenance": False})
    await asyncio.wait_for(started.wait(), 15)
    assert (await pooled.cancel(job.id)).state == awa.JobState.Cancelled
    release.set()
    await asyncio.wait_for(pooled.runtime.wait_attempts_ended(1), 15)
    assert seen == [False]
    assert (await job_row(dsn, job.id))["state"] == "cancelled"


async def test_wake_ups_through_a_direct_listen_url(dsn, bouncer):
    """With ``listen_url`` the runtime listens there: an insert's NOTIFY (sent through the
    pooler) wakes the dispatcher, which would otherwise sleep for the hour-long poll; its
    LISTEN connection terminated, the listen loop replaces it while the pooled path lives."""
    await truncate(dsn)
    c = awa.AsyncClient(bouncer.url(dsn), pooler="transaction", listen_url=dsn)
    try:

        @c.task(Item)
        async def item(job):
            return None

        await c.start([("default", 2)], **{**FAST, "poll_interval_ms": 3_600_000})
        assert c.runtime.listener.conn is not None
        assert c.runtime.listener.conn.info.backend_pid == await _server_pid(
            c.runtime.listener.conn
        )
        job = await c.insert(Item(1))
        await wait_state(c, job.id, "completed")
        # Its server connection terminated while the pooled path lives: the listen loop
        # connects and LISTENs again on its own (its 5 s backoff, not the hour-long poll).
        first = c.runtime.listener.conn
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as admin:
            await admin.execute("SELECT pg_terminate_backend(%s)", (first.info.backend_pid,))

            async def replaced() -> bool:
                conn = c.runtime.listener.conn
                return conn is not None and conn is not first and not conn.closed

            # polled: the listen loop's reconnect fires no signal of its own
            await poll_until(replaced, timeout=30, what="a new LISTEN connection")
            cur = await admin.execute(
                "SELECT query FROM pg_stat_activity WHERE pid = %s",
                (c.runtime.listener.conn.info.backend_pid,),
            )
            assert (await cur.fetchone())[0].startswith("LISTEN")
        job = await c.insert(Item(2))
        await wait_state(c, job.id, "completed")
    finally:
        await c.close()


async def _server_pid(conn) -> int:
    return (await (await conn.execute("SELECT pg_backend_pid()")).fetchone())[0]


# -- leadership by the lease -----------------------------------------------------------------------


def _maintenance(client, url: str, pooler: str | None = "transaction") -> Maintenance:
    return Maintenance(
        url,
        client.pool,
        MaintenanceConfig(heartbeat_staleness_ms=STALE_MS, leader_election_interval_ms=100),
        pooler=pooler,
    )


async def _lease(dsn) -> dict:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute(
            "SELECT epoch, holder, via_lock, expires_at > now() AS live FROM awa_fast.leader_lease"
        )
        row = await cur.fetchone()
        return dict(zip([d.name for d in cur.description], row))


async def test_exactly_one_leader_and_stop_hands_over_at_once(dsn, bouncer):
    await truncate(dsn)
    url = bouncer.url(dsn)
    async with (
        awa.AsyncClient(url, pooler="transaction") as c1,
        awa.AsyncClient(url, pooler="transaction") as c2,
    ):
        a, b = _maintenance(c1, url), _maintenance(c2, url)
        try:
            got = await asyncio.gather(a.acquire(), b.acquire())
            assert sorted(got) == [False, True]
            leader, other = (a, b) if got[0] else (b, a)
            assert (await _lease(dsn))["epoch"] == leader.epoch and not (await _lease(dsn))[
                "via_lock"
            ]
            assert await leader.leader.renew()
            assert not await other.acquire()  # the lease is live: refused
            await leader._step_down()  # a stop frees the lease
            assert not (await _lease(dsn))["live"]
            assert await other.acquire()
            assert other.epoch == leader.epoch + 1
            # the old leader's passes are fenced
            with pytest.raises(Deposed):
                async with leader.fenced():
                    pass
        finally:
            await a._step_down()
            await b._step_down()


async def test_a_dead_leaders_lease_expires_and_its_late_passes_are_fenced(dsn, bouncer):
    """A leader that stops renewing (dead, frozen, cut off) keeps the lease until it expires
    (heartbeat_staleness_ms); then another takes it and bumps the epoch, and everything the old
    one still tries to write finds no row at its epoch and raises ``Deposed``."""
    await truncate(dsn)
    url = bouncer.url(dsn)
    async with (
        awa.AsyncClient(url, pooler="transaction") as c1,
        awa.AsyncClient(url, pooler="transaction") as c2,
    ):
        dead, heir = _maintenance(c1, url), _maintenance(c2, url)
        try:
            assert await dead.acquire()
            # it renews no more (its process died, as the server sees it): the heir waits
            assert not await heir.acquire()

            # polled: the lease expires by the server's clock, nothing signals it
            await poll_until(heir.acquire, timeout=15, what="the dead leader's lease expired")
            assert heir.epoch == dead.epoch + 1
            assert (await _lease(dsn))["holder"] is not None
            with pytest.raises(Deposed):
                async with dead.fenced():
                    pass
            assert not await dead.leader.renew()  # its hold finds the epoch moved: it steps down
        finally:
            await dead._step_down()
            await heir._step_down()
        assert (await _lease(dsn))["epoch"] == heir.epoch


_LEADER_CHILD = (
    """
import asyncio, sys
import awa_fast as awa

async def main(url):
    client = awa.AsyncClient(url, pooler="transaction")

    @client.task(dict, kind="noop")
    async def noop(job):
        return None

    await client.start(
        [("default", 1)], poll_interval_ms=50, heartbeat_interval_ms=100,
        heartbeat_staleness_ms=%d, leader_election_interval_ms=100,
    )
    m = client.runtime.maintenance
    await m.leadership.wait_until(lambda: m.is_leader)
    print("leader", m.epoch, flush=True)
    await asyncio.Event().wait()

asyncio.run(main(sys.argv[1]))
"""
    % STALE_MS
)


async def test_a_killed_pooled_leader_is_replaced_once_its_lease_expires(dsn, bouncer):
    """A real death: a worker process leading through PgBouncer is SIGKILLed (nothing steps
    down, nothing is released); another process takes the lease once it expires, and the dead
    one's epoch is fenced off."""
    await truncate(dsn)
    url = bouncer.url(dsn)
    child = subprocess.Popen(
        [sys.executable, "-c", _LEADER_CHILD, url],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        line = await asyncio.wait_for(asyncio.to_thread(child.stdout.readline), 60)
        assert line.startswith("leader"), line
        dead_epoch = int(line.split()[1])
        lease = await _lease(dsn)
        assert (lease["epoch"], lease["via_lock"], lease["live"]) == (dead_epoch, False, True)
    finally:
        child.kill()
        child.wait()
    async with awa.AsyncClient(url, pooler="transaction") as c:
        heir = _maintenance(c, url)
        try:
            # polled: the dead process's lease expires by the server's clock
            await poll_until(heir.acquire, timeout=15, what="the killed leader's lease expired")
            assert heir.epoch == dead_epoch + 1
            late = _maintenance(c, url)
            late.leader.epoch = dead_epoch  # what the killed leader's passes would still carry
            with pytest.raises(Deposed):
                async with late.fenced():
                    pass
        finally:
            await heir._step_down()


async def test_a_pooled_leader_renews_while_handlers_hold_every_pool_connection(dsn, bouncer):
    """The lease is renewed on the election's own connection: a leader whose pool is all in
    use (handlers holding connections, ``max_connections`` below the slots) keeps leading."""
    await truncate(dsn)
    url = bouncer.url(dsn)
    async with awa.AsyncClient(url, max_connections=1, pooler="transaction") as c:
        m = _maintenance(c, url)
        try:
            assert await m.acquire()
            async with (await c.pool()).connection():  # the pool's only connection, held
                assert await asyncio.wait_for(m.leader.renew(), 10)
        finally:
            await m._step_down()


async def test_the_dashboard_reads_through_the_pooler_and_shows_the_pooled_leader(dsn, bouncer):
    """The dashboard's reads set their timeout per transaction (SET LOCAL), so they run
    through the pooler; a pooled leader holds no advisory lock, so its lease is what shows."""
    from awa_fast.web.reads import Reads

    await truncate(dsn)
    url = bouncer.url(dsn)
    async with awa.AsyncClient(url, pooler="transaction") as c:
        m = _maintenance(c, url)
        reads = Reads(url)
        try:
            assert await m.acquire()
            await reads.open()
            workers = await reads.workers()
            assert workers["leader"] is None
            lease = workers["lease"]
            assert lease["live"] and lease["epoch"] == m.epoch and not lease["via_lock"]
        finally:
            await reads.close()
            await m._step_down()


async def test_a_direct_process_and_a_pooled_one_never_lead_together(dsn, bouncer):
    """One deployment, two modes: the lock-holding direct process takes the lease too, so a
    process behind the pooler waits for it; and a lease held by the pooled process keeps the
    direct one from leading although it gets the advisory lock."""
    await truncate(dsn)
    url = bouncer.url(dsn)
    async with (
        awa.AsyncClient(dsn) as direct_client,
        awa.AsyncClient(url, pooler="transaction") as pooled_client,
    ):
        direct = _maintenance(direct_client, dsn, pooler=None)
        pooled = _maintenance(pooled_client, url)
        try:
            assert await direct.acquire()
            assert (await _lease(dsn))["via_lock"]
            assert not await pooled.acquire()
            await direct._step_down()
            assert await pooled.acquire()
            assert not await direct.acquire()  # the lock is free, the lease is not
            assert direct.leader.lock_conn is None  # it let go of the lock again
        finally:
            await direct._step_down()
            await pooled._step_down()


async def test_a_killed_direct_leader_is_replaced_at_once_by_the_next_lock_holder(dsn, client):
    """Direct connections keep today's hand-over: a leader whose lock connection dies (a
    killed process) leaves a lease that the next advisory-lock holder may take before it
    expires."""
    await truncate(dsn)
    first, second = _maintenance(client, dsn, pooler=None), _maintenance(client, dsn, pooler=None)
    first.config.heartbeat_staleness_ms = 3_600_000  # its lease would outlive the test
    try:
        assert await first.acquire()
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as admin:
            await admin.execute(
                "SELECT pg_terminate_backend(%s)", (first.leader.lock_conn.info.backend_pid,)
            )
        assert (await _lease(dsn))["live"]
        assert await second.acquire()
        assert second.epoch == first.epoch + 1
    finally:
        await first._step_down()
        await second._step_down()


# -- misconfigurations, refused at start --------------------------------------------------------------


async def test_a_pooler_not_declared_is_refused_before_anything_is_written(dsn, bouncer):
    await truncate(dsn)
    workers = await scalar(dsn, "SELECT count(*) FROM awa_fast.workers")
    c = awa.AsyncClient(bouncer.url(dsn))
    try:
        with pytest.raises(ConfigError) as err:
            await c.insert(Item(1))
        assert err.value.field == "pooler" and "pooler='transaction'" in str(err.value)

        @c.task(Item)
        async def item(job):
            return None

        with pytest.raises(ConfigError):
            await c.start([("default", 1)], **FAST)
        assert c.runtime is None
    finally:
        await c.close()
    assert await scalar(dsn, "SELECT count(*) FROM awa_fast.jobs_all") == 0
    assert await scalar(dsn, "SELECT count(*) FROM awa_fast.workers") == workers  # none added


async def test_a_session_pooler_declared_works_as_direct(dsn, session_bouncer):
    await truncate(dsn)
    async with awa.AsyncClient(session_bouncer.url(dsn), pooler="session") as c:
        job = await c.insert(Item(1))
        assert (await job_row(dsn, job.id))["state"] == "available"


async def test_a_session_pooler_declared_at_a_transaction_pooler_is_refused(dsn, bouncer):
    """``pooler="session"`` at PgBouncer in ``pool_mode=transaction`` would LISTEN through it
    (hearing nothing) and prepare statements there: refused at the first use, before anything
    is written, naming ``pooler='transaction'``. (Two client connections are handed the same
    server connection one after the other: a session pooler never does that while the first
    is connected.)"""
    await truncate(dsn)
    c = awa.AsyncClient(bouncer.url(dsn), pooler="session")
    try:
        with pytest.raises(ConfigError) as err:
            await c.insert(Item(1))
        assert err.value.field == "pooler" and "pooler='transaction'" in str(err.value)
    finally:
        await c.close()
    assert await scalar(dsn, "SELECT count(*) FROM awa_fast.jobs_all") == 0


async def test_a_listen_url_through_the_pooler_is_refused_at_start(dsn, bouncer):
    await truncate(dsn)
    workers = await scalar(dsn, "SELECT count(*) FROM awa_fast.workers")
    url = bouncer.url(dsn)
    c = awa.AsyncClient(url, pooler="transaction", listen_url=url)
    try:

        @c.task(Item)
        async def item(job):
            return None

        with pytest.raises(ConfigError) as err:
            await c.start([("default", 1)], **FAST)
        assert err.value.field == "listen_url"
        assert c.runtime is None
    finally:
        await c.close()
    assert await scalar(dsn, "SELECT count(*) FROM awa_fast.workers") == workers  # none added


async def test_bad_pooler_settings_are_refused_at_construction(dsn):
    with pytest.raises(ConfigError) as err:
        awa.AsyncClient(dsn, pooler="statement")
    assert err.value.field == "pooler"
    with pytest.raises(ConfigError) as err:
        awa.AsyncClient(dsn, listen_url=dsn)  # only with pooler="transaction"
    assert err.value.field == "listen_url"


async def test_a_transaction_pooler_needs_read_committed_by_default(dsn, pg_base_dsn):
    """A session SET cannot reach the server connections a transaction pooler hands out: a
    database whose default isolation is another level is refused at start, naming the fix.
    (A PgBouncer of its own: its server connections all open under the altered default.)"""
    await truncate(dsn)
    name = conninfo_to_dict(dsn)["dbname"]

    async def set_default(level: str | None) -> None:
        statement = (
            "ALTER DATABASE {} RESET default_transaction_isolation"
            if level is None
            else f"ALTER DATABASE {{}} SET default_transaction_isolation = '{level}'"
        )
        async with await psycopg.AsyncConnection.connect(pg_base_dsn, autocommit=True) as admin:
            await admin.execute(psycopg.sql.SQL(statement).format(psycopg.sql.Identifier(name)))

    await set_default("repeatable read")
    try:
        with running_bouncer(pg_base_dsn, "transaction") as own:
            c = awa.AsyncClient(own.url(dsn), pooler="transaction")
            try:
                with pytest.raises(ConfigError) as err:
                    await c.insert(Item(1))
                assert err.value.field == "pooler" and "read committed" in str(err.value)
            finally:
                await c.close()
    finally:
        await set_default(None)


def _cli(*args: str, env: dict) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("AWA_FAST_", "DATABASE_URL"))}
    return subprocess.run(
        [sys.executable, "-m", "awa_fast", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**base, **env},
    )


def test_the_cli_through_the_pooler_with_awa_fast_pooler(dsn, bouncer, fresh_db):
    """The CLI (and the dashboard) are told the mode by ``$AWA_FAST_POOLER``: without it a
    command through PgBouncer fails naming the setting; with it, it works; migrations run
    through the pooler too (no prepared statements, no session SET)."""
    url = bouncer.url(dsn)
    refused = _cli("--database-url", url, "queue", "stats", env={})
    assert refused.returncode != 0 and "AWA_FAST_POOLER" not in refused.stdout
    assert "pooler" in refused.stderr, refused.stderr
    r = _cli("--database-url", url, "queue", "stats", env={"AWA_FAST_POOLER": "transaction"})
    assert r.returncode == 0, r.stderr
    r = _cli(
        "--database-url", bouncer.url(fresh_db), "migrate", env={"AWA_FAST_POOLER": "transaction"}
    )
    assert r.returncode == 0, r.stderr
    with psycopg.connect(fresh_db) as conn:
        version = conn.execute("SELECT max(version) FROM awa_fast.schema_version").fetchone()
    assert version == (current_migration_version(),)
    bad = _cli("--database-url", url, "queue", "stats", env={"AWA_FAST_POOLER": "statement"})
    assert bad.returncode != 0 and "AWA_FAST_POOLER" in bad.stderr, bad.stderr


async def test_a_pooler_with_no_free_server_connection_fails_the_first_use_clearly(
    dsn, pg_base_dsn
):
    """PgBouncer's pool for this database is exhausted (``default_pool_size`` server
    connections all held by other clients' transactions) and it queues clients without bound
    (``query_wait_timeout = 0``): the client's first use fails within a bounded time, naming
    the pooler's limit, instead of waiting for a server connection forever."""
    await truncate(dsn)
    with running_bouncer(
        pg_base_dsn, "transaction", default_pool_size=1, settings={"query_wait_timeout": 0}
    ) as own:
        url = own.url(dsn)
        async with await psycopg.AsyncConnection.connect(url) as holder:
            await holder.execute("SELECT 1")  # a transaction open: the only server connection
            c = awa.AsyncClient(url, pooler="transaction")
            try:
                with pytest.raises(awa.DatabaseUnavailable) as err:
                    await asyncio.wait_for(c.insert(Item(1)), 120)  # (the bound of a failure)
                assert "default_pool_size" in str(err.value), err.value
            finally:
                await c.close()


@contextlib.asynccontextmanager
async def _terminated_once(dsn: str, event: str, table: str, when: str):
    """The first ``event`` (INSERT / UPDATE) of a row of ``table`` matching ``when`` is held
    by a trigger added outside awa-fast (``pg_sleep``: a sequence counts the firings outside
    any transaction), and the backend holding it -- through PgBouncer, one of its server
    connections, mid-transaction -- is terminated once the awaited ``stalled()`` (yielded)
    returns its pid. Trigger, function and sequence are dropped afterwards."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as admin:
        await admin.execute(f"""
            DROP SEQUENCE IF EXISTS public.stall_once;
            CREATE SEQUENCE public.stall_once;
            CREATE OR REPLACE FUNCTION public.stall_once() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF nextval('public.stall_once') = 1 THEN PERFORM pg_sleep(60); END IF;
                RETURN NEW;
            END $$;
            DROP TRIGGER IF EXISTS stall_once ON {table};
            CREATE TRIGGER stall_once BEFORE {event} ON {table} FOR EACH ROW
                WHEN ({when}) EXECUTE FUNCTION public.stall_once();""")

        async def terminate_stalled() -> None:
            async def stalled() -> list:
                cur = await admin.execute(
                    "SELECT pid FROM pg_stat_activity WHERE wait_event = 'PgSleep' "
                    "AND datname = current_database()"
                )
                return await cur.fetchall()

            # polled: a server backend's wait has no signal in this process
            (pid,), *_ = await poll_until(stalled, timeout=30, what="a transaction held")
            await admin.execute("SELECT pg_terminate_backend(%s)", (pid,))

        try:
            yield terminate_stalled, admin
        finally:
            await admin.execute(
                f"DROP TRIGGER IF EXISTS stall_once ON {table}; "
                "DROP FUNCTION IF EXISTS public.stall_once(); "
                "DROP SEQUENCE IF EXISTS public.stall_once"
            )


async def test_a_pooler_server_connection_terminated_mid_staging_stages_each_follow_up_once(
    dsn, pooled
):
    """Seed 000 through PgBouncer: the server connection running a completion's transaction
    (its follow-up being inserted: a trigger outside awa-fast holds it there) is terminated.
    PgBouncer drops its client; the completion is settled again on another connection, and
    each completed parent has exactly one follow-up."""
    async with _terminated_once(dsn, "INSERT", "awa_fast.jobs", "NEW.kind = 'next'") as (
        terminate_stalled,
        admin,
    ):

        @pooled.task(Next)
        async def next_job(job):
            return None

        @pooled.task(Item)
        async def item(job):
            job.enqueue_on_completion(Next(job.args.n))

        parents = await pooled.insert_many([Item(i) for i in range(3)])
        await pooled.start([("default", 3)], **{**FAST, "heartbeat_staleness_ms": 2000})
        await terminate_stalled()
        for job in parents:
            await wait_state(pooled, job.id, "completed", timeout=30)

        async def follow_ups() -> list:
            cur = await admin.execute(
                "SELECT args->>'n', count(*) FROM awa_fast.jobs_all WHERE kind = 'next' "
                "GROUP BY 1 ORDER BY 1"
            )
            return await cur.fetchall()

        async def three_parents_followed() -> bool:
            return len(await follow_ups()) == 3

        await until(three_parents_followed, pooled, what="every parent's follow-up")
        assert await follow_ups() == [("0", 1), ("1", 1), ("2", 1)]


async def test_a_pooler_server_connection_terminated_mid_settlement_settles_the_failure(
    dsn, pooled
):
    """Seed 003 through PgBouncer: the server connection settling a failed job (its row moving
    to finished storage after its consequence applied: a trigger holds it there) is
    terminated mid-transaction. The job still ends failed with its consequence applied (the
    repeat-safe effect may run again: never zero times), and nothing is left running."""
    applied: list[int] = []

    async def release(failure: awa.JobFailure) -> None:
        applied.append(failure.id)

    @pooled.task(Item, failure_consequence=release)
    async def item(job):
        raise awa.TerminalError("declined")

    async with _terminated_once(dsn, "INSERT", "awa_fast.jobs_done", "NEW.state = 'failed'") as (
        terminate_stalled,
        _,
    ):
        failing = await pooled.insert_many([Item(i, "fail") for i in range(2)], max_attempts=1)
        await pooled.start([("default", 2)], **{**FAST, "heartbeat_staleness_ms": 2000})
        await terminate_stalled()
        for job in failing:
            row = await wait_state(pooled, job.id, "failed", timeout=30)
            assert row["consequence_state"] == "applied"
    assert set(applied) == {j.id for j in failing}
    assert await scalar(dsn, "SELECT count(*) FROM awa_fast.jobs_all WHERE state = 'running'") == 0


async def test_a_worker_rides_out_pgbouncer_pause_reconnect_and_kill(dsn, pg_base_dsn):
    """PgBouncer's admin console mid-run: ``PAUSE`` (every query waits) then ``RESUME``;
    ``RECONNECT`` (server connections replaced as released); ``KILL`` (every client and server
    connection of the database dropped: the pool's, the heartbeat's, the lease's) and its
    ``RESUME``. After each,
    a job inserted directly is run, and a running handler's attempt keeps being heartbeaten."""
    await truncate(dsn)
    name = conninfo_to_dict(dsn)["dbname"]
    user = conninfo_to_dict(dsn).get("user", "postgres")
    with running_bouncer(pg_base_dsn, "transaction", settings={"admin_users": user}) as own:
        console = conninfo_to_dict(own.url(dsn))
        console["dbname"] = "pgbouncer"
        c = awa.AsyncClient(own.url(dsn), pooler="transaction")
        direct = awa.AsyncClient(dsn)
        try:

            @c.task(Item)
            async def item(job):  # completes only once its attempt was heartbeaten twice
                beaten = c.runtime.heartbeat.beaten
                start = beaten.count
                await beaten.wait_until(lambda: beaten.count >= start + 2, timeout=30)

            await c.start([("default", 2)], **{**FAST, "heartbeat_staleness_ms": 2000})
            with psycopg.connect(make_conninfo(**console), autocommit=True) as admin:
                for command in ("PAUSE", "RECONNECT", f"KILL {name}"):
                    if command == "PAUSE":
                        admin.execute("PAUSE")
                        job = await direct.insert(Item(1))
                        admin.execute("RESUME")
                    else:
                        admin.execute(command)
                        if command.startswith("KILL"):
                            admin.execute(f"RESUME {name}")  # a killed database waits for it
                        job = await direct.insert(Item(2))
                    await wait_state(c, job.id, "completed", timeout=30)
        finally:
            await c.close()
            await direct.close()


async def test_a_pooler_at_max_client_conn_refuses_the_client_with_its_reason(dsn):
    """PgBouncer at ``max_client_conn``: the client's construction-time connect, and the
    pool's first connect at the first insert, fail with ``DatabaseUnavailable`` carrying
    PgBouncer's reason."""
    with running_bouncer(dsn, "transaction", max_client_conn=1) as own:
        url = own.url(dsn)
        async with await psycopg.AsyncConnection.connect(url):  # the one client allowed
            with pytest.raises(awa.DatabaseUnavailable) as err:
                awa.AsyncClient(url, pooler="transaction")
            assert "max_client_conn" in str(err.value), err.value
        c = awa.AsyncClient(url, pooler="transaction")  # (constructed while there was room)
        try:
            async with await psycopg.AsyncConnection.connect(url):
                with pytest.raises(awa.DatabaseUnavailable) as err:
                    await c.insert(Item(1))  # the pool's first connect
                assert "max_client_conn" in str(err.value), err.value
        finally:
            await c.close()
