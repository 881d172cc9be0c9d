"""Failover (issue 31): a primary with a streaming standby (``pg_basebackup``), workers of
``awa-fast worker tests.failover_app:client --processes 2`` on the multi-host URL
``host=127.0.0.1,127.0.0.1 port=P,S target_session_attrs=read-write``; the primary is stopped
(``-m immediate``) while they run and the standby promoted (``pg_ctl promote``). The worker
processes are never restarted: each one's pool, heartbeat, listener, election and finalizer
move to the promoted server by themselves.

- synchronous replication: nothing acknowledged before the failover is lost (inserts,
  completions, staged follow-ups, failure consequences), follow-ups stay exactly one per
  completed parent, and the workers drain the rest on the new primary;
- a switchover: the primary fenced read-only (``default_transaction_read_only``) and left
  running, the standby promoted once it replayed everything: the workers leave the fenced
  server on their own (its answers say it takes no writes), lose nothing, and a caller's own
  transaction there gets ``ReadOnlyDatabase``;
- asynchronous replication, with the standby cut off from the primary for a while first (the
  replication lag a failover meets, made certain): exactly what was acknowledged after the
  standby's last replayed WAL is lost (inserts, completions), the completed jobs whose
  completion was lost run again (at-least-once) and nothing stays ``running``.

Each test starts two servers of its own (ports and directories of their own: parallel-safe)
and stops them in a finalizer. The tests wait on rows and on the launcher's lines.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
from collections import Counter
from pathlib import Path

import psutil
import psycopg
import pytest

import awa_fast as awa
from awa_fast.connections import Pool
from awa_fast.embedded import TempServer, start_temp
from awa_fast.errors import ConfigError
from awa_fast.schema import migrate_sync
from tests.failover_app import FoParent, FoPay, FoSlow
from tests.runtime.test_launcher import Launcher
from tests.support import poll_until

STANDBY = "failover_standby"
APP = "tests.failover_app:client"
# Every state a job of these tests leaves on its way to finished: a failed pay job passes
# through consequence_pending (its consequence owed) before the reconciler settles it.
UNSETTLED = (
    "available",
    "running",
    "retryable",
    "scheduled",
    "waiting_external",
    "consequence_pending",
)
INSERT_PACE_S = 0.01  # the synchronous test's producer: one insert, then this pause


class Pair:
    """A primary (its ``awa`` database migrated) and its streaming standby."""

    def __init__(self) -> None:
        self.servers: list[TempServer] = []
        self.primary = self._keep(start_temp())
        with psycopg.connect(self.primary.dsn, autocommit=True) as conn:
            conn.execute("CREATE DATABASE awa")
        self.primary_dsn = self._dsn(self.primary)
        migrate_sync(self.primary_dsn)
        with psycopg.connect(self.primary_dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE public.failover_effects (n int PRIMARY KEY)")
        self.standby = self._keep(self.primary.start_standby(application_name=STANDBY))
        self.standby_dsn = self._dsn(self.standby)
        self.url = (
            f"host=127.0.0.1,127.0.0.1 port={self.primary.port},{self.standby.port} "
            "user=postgres dbname=awa target_session_attrs=read-write connect_timeout=5"
        )

    def _keep(self, server: TempServer) -> TempServer:
        self.servers.append(server)
        return server

    @staticmethod
    def _dsn(server: TempServer) -> str:
        return f"host=127.0.0.1 port={server.port} user=postgres dbname=awa"

    def stop(self) -> None:
        for server in self.servers:
            server.stop()


@pytest.fixture
def pair():
    made = Pair()
    try:
        yield made
    finally:
        made.stop()


@pytest.fixture
def launchers():
    started: list[Launcher] = []
    yield started
    for launcher in started:  # a graceful stop: its children close their connections
        if launcher.proc.poll() is None:
            launcher.proc.send_signal(signal.SIGTERM)
            try:
                launcher.proc.wait(20)
            except subprocess.TimeoutExpired:
                pass
        launcher.stop()


async def rows(dsn: str, query: str, params=None) -> list[tuple]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(query, params)
        return await cur.fetchall()


async def scalar(dsn: str, query: str, params=None):
    return (await rows(dsn, query, params))[0][0]


async def replication_state(pair: Pair) -> tuple[str, str] | None:
    """The standby's (state, sync_state) on the primary, or None when it is not connected."""
    found = await rows(
        pair.primary_dsn,
        "SELECT state, sync_state FROM pg_stat_replication WHERE application_name = %s",
        (STANDBY,),
    )
    return found[0] if found else None


async def finished(dsn: str) -> dict[int, tuple[str, str, int]]:
    """``{job id: (kind, state, n)}`` of the finished jobs."""
    found = await rows(
        dsn,
        "SELECT id, kind, state::text, (args->>'n')::int FROM awa_fast.jobs_all "
        "WHERE state IN ('completed', 'failed')",
    )
    return {r[0]: (r[1], r[2], r[3]) for r in found}


def runs(directory: Path) -> list[tuple[int, str, int, int, int]]:
    """Every handler run the processes logged: ``(pid, kind, n, job id, attempt)``."""
    found = []
    for path in directory.glob("runs.*"):
        pid = int(path.name.split(".")[1])
        for line in path.read_text().splitlines():
            kind, n, job_id, attempt = line.split()
            found.append((pid, kind, int(n), int(job_id), int(attempt)))
    return found


def start_workers(pair: Pair, launchers: list, runs_dir: Path) -> tuple[Launcher, dict]:
    launcher = Launcher(
        pair.url,
        "--processes",
        "2",
        "--queues",
        "default:8",
        app=APP,
        env={
            "AWA_FAST_FAILOVER_URL": pair.url,
            "AWA_FAST_FAILOVER_RUNS": str(runs_dir),
            "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
        },
    )
    launchers.append(launcher)
    return launcher, launcher.ready_pids(2)


def sockets_to(pids, port: int) -> list:
    """The TCP sockets the processes ``pids`` still hold to ``port`` (any state: one in
    CLOSE_WAIT is a connection the server closed and the process never let go of)."""
    return [
        (pid, c.status)
        for pid in pids
        for c in psutil.Process(pid).net_connections(kind="tcp")
        if c.raddr and c.raddr.port == port
    ]


async def drained(dsn: str, expected: int) -> bool:
    """At least ``expected`` jobs finished (completed or failed) and none left to settle."""
    found = await rows(
        dsn,
        "SELECT count(*) FILTER (WHERE state IN ('completed', 'failed')), "
        "count(*) FILTER (WHERE state::text = ANY(%s)) FROM awa_fast.jobs_all",
        (list(UNSETTLED),),
    )
    done, left = found[0]
    return done >= expected and left == 0


async def on_new_primary(pair: Pair, pids) -> bool:
    """Every process listens on the promoted server, and one of them leads there (its election
    connection holds the leader's advisory lock)."""
    names = {f"failover_{pid}" for pid in pids}
    listening = await rows(
        pair.standby_dsn,
        "SELECT DISTINCT application_name FROM pg_stat_activity WHERE query LIKE 'LISTEN%%'",
    )
    leading = await rows(
        pair.standby_dsn,
        "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a USING (pid) "
        "WHERE l.locktype = 'advisory' AND l.granted",
    )
    return names <= {r[0] for r in listening} and any(r[0] in names for r in leading)


async def assert_the_same_processes_moved(pair: Pair, launcher: Launcher, pids, ran) -> None:
    """The processes that ran before the failover ran the rest (none was restarted), and each
    one's listener and election are on the promoted server, none left on the old one."""
    assert {pid for pid, *_ in ran} <= set(pids.values())
    assert all(psutil.pid_exists(pid) for pid in pids.values())
    assert "exited" not in launcher.transcript()
    await poll_until(lambda: on_new_primary(pair, pids.values()), 30, "listeners, leader")
    # (the processes' sockets, read from the kernel)
    await poll_until(
        lambda: _true(not sockets_to(pids.values(), pair.primary.port)), 30, "old sockets closed"
    )


async def streaming(pair: Pair, sync_state: str) -> None:
    # the primary reports its standby streaming, synchronously or not (a row)
    await poll_until(
        lambda: _is(replication_state(pair), ("streaming", sync_state)), 30, "a streaming standby"
    )


def assert_follow_ups_exact(after: dict[int, tuple[str, str, int]]) -> None:
    """One ``FoChild(n)`` per completed ``FoParent(n)``, none for any other n."""
    parents = {
        n for kind, state, n in after.values() if kind == "fo_parent" and state == "completed"
    }
    children = Counter(n for kind, _s, n in after.values() if kind == "fo_child")
    assert set(children) == parents, set(children) ^ parents
    assert all(c == 1 for c in children.values()), {n: c for n, c in children.items() if c > 1}


@pytest.mark.integration
async def test_synchronous_failover_loses_nothing_acknowledged(pair, launchers, tmp_path):
    await asyncio.to_thread(
        _run_sql,
        pair.primary_dsn,
        f"ALTER SYSTEM SET synchronous_standby_names = '{STANDBY}'",
        "SELECT pg_reload_conf()",
    )
    await streaming(pair, "sync")
    launcher, pids = start_workers(pair, launchers, tmp_path)
    client = awa.AsyncClient(pair.url)
    acked: dict[int, str] = {}  # job id -> phase of its acknowledged insert
    phase = ["before"]
    stop = asyncio.Event()

    async def insert_forever() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            try:
                args = FoPay(n) if n % 5 == 0 else FoParent(n)
                acked[(await client.insert(args)).id] = phase[0]
            except awa.DatabaseError:
                pass  # not acknowledged: during the failover (either outcome is allowed)
            await asyncio.sleep(INSERT_PACE_S)  # a steady producer, not a flood to drain

    inserting = asyncio.create_task(insert_forever())
    try:
        # workers and inserts run: 60 parents and pays finished on the primary (rows)
        await poll_until(
            lambda: _at_least(scalar(pair.primary_dsn, _COUNT_FINISHED), 60), 60, "work done"
        )
        # Everything visible on a synchronous primary has been flushed by the standby (a
        # commit waits for it before it becomes visible): a subset of what was acknowledged.
        seen_before = await finished(pair.primary_dsn)
        effects_before = {
            r[0] for r in await rows(pair.primary_dsn, "SELECT n FROM public.failover_effects")
        }
        await asyncio.to_thread(pair.primary.halt, "immediate")
        phase[0] = "during"
        await asyncio.to_thread(pair.standby.promote)
        phase[0] = "after"
        # the inserter's own client reaches the promoted primary: 30 inserts acknowledged there
        await poll_until(lambda: _count_after(acked), 60, "inserts on the promoted primary")
        slow = [await client.insert(FoSlow(n)) for n in range(2)]
    finally:
        stop.set()
        await inserting
        await client.close()

    # every job the workers saw drains on the promoted server (rows)
    await poll_until(lambda: drained(pair.standby_dsn, len(acked)), 90, "the queue drained")
    after = await finished(pair.standby_dsn)
    present = {r[0] for r in await rows(pair.standby_dsn, "SELECT id FROM awa_fast.jobs_all")}
    assert set(acked) <= present, sorted(set(acked) - present)  # no acknowledged insert lost
    for job_id, (kind, state, _n) in seen_before.items():  # no finalization lost
        assert after.get(job_id, (kind, None, _n))[1] == state, (job_id, kind, state)
    effects = {r[0] for r in await rows(pair.standby_dsn, "SELECT n FROM public.failover_effects")}
    assert effects_before <= effects  # no applied failure consequence lost
    failed_pays = {n for kind, state, n in after.values() if kind == "fo_pay" and state == "failed"}
    assert failed_pays <= effects  # and every failed pay's consequence is applied
    assert_follow_ups_exact(after)
    ran = runs(tmp_path)
    again = Counter(job_id for _pid, kind, _n, job_id, _a in ran if kind == "parent")
    # a completion acknowledged before the failover never runs again
    assert not [j for j, (k, _s, _n) in seen_before.items() if k == "fo_parent" and again[j] > 1]
    # 3 s handlers on the promoted primary ran once: their heartbeats reached it
    slow_runs = Counter(job_id for _p, kind, _n, job_id, _a in ran if kind == "slow")
    assert [slow_runs[j.id] for j in slow] == [1, 1]
    await assert_the_same_processes_moved(pair, launcher, pids, ran)


@pytest.mark.integration
async def test_asynchronous_failover_loses_only_the_lag_and_leaves_nothing_running(
    pair, launchers, tmp_path
):
    await streaming(pair, "async")  # (the default: no synchronous_standby_names)
    launcher, pids = start_workers(pair, launchers, tmp_path)
    client = awa.AsyncClient(pair.url)
    try:
        await client.insert_many([FoParent(n) for n in range(150)])
        await client.insert_many([FoPay(n) for n in range(150, 170)])
        # 30 finished on the primary (rows)
        await poll_until(
            lambda: _at_least(scalar(pair.primary_dsn, _COUNT_FINISHED), 30), 60, "work done"
        )
        # Replication lag, made certain: the standby stops receiving WAL (its WAL receiver
        # ends when primary_conninfo is emptied) and replays what it received; that is all the
        # promoted server will have.
        await asyncio.to_thread(
            _run_sql,
            pair.standby_dsn,
            "ALTER SYSTEM SET primary_conninfo = ''",
            "SELECT pg_reload_conf()",
        )
        await poll_until(lambda: _is(replication_state(pair), None), 30, "the standby cut off")
        await poll_until(lambda: _replayed_all(pair.standby_dsn), 30, "the standby replayed")
        kept = await finished(pair.standby_dsn)
        kept_lsn = await scalar(pair.standby_dsn, "SELECT pg_last_wal_replay_lsn()")
        # acknowledged by the primary after the cut
        await client.insert_many([FoParent(n) for n in range(1000, 1010)])
        await poll_until(
            lambda: _at_least(scalar(pair.primary_dsn, _COUNT_FINISHED), len(kept) + 30),
            60,
            "30 more jobs finished on the primary after the cut",
        )
        seen_before = await finished(pair.primary_dsn)
        lag = await scalar(
            pair.primary_dsn,
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s::pg_lsn)",
            (kept_lsn,),
        )
        await asyncio.to_thread(pair.primary.halt, "immediate")
    finally:
        await client.close()
    await asyncio.to_thread(pair.standby.promote)
    assert lag > 0  # bytes of WAL the primary acknowledged and the standby never had

    # Lost: the inserts acknowledged after the cut (by identity: the promoted server's ids go
    # on from what it replayed, so it hands out some of the lost ids again) ...
    assert await scalar(pair.standby_dsn, _COUNT_LAGGING) == 0
    # ... and every finalization made after it: those jobs are back as they were at the cut
    # (claimed, running or available); the new primary's rescue settles every one and the
    # workers drain the queue: nothing stays running.
    await poll_until(lambda: drained(pair.standby_dsn, 170), 90, "the queue drained")
    after = await finished(pair.standby_dsn)
    assert await scalar(pair.standby_dsn, _COUNT_LAGGING) == 0
    originals = {j for j, (k, _s, n) in after.items() if k != "fo_child"}
    assert len(originals) == 170  # every job inserted before the cut, finished once
    assert_follow_ups_exact(after)
    relost = {
        j
        for j, (k, _s, n) in seen_before.items()
        if k in ("fo_parent", "fo_pay") and n < 1000 and j not in kept
    }
    assert relost  # finalizations lost with the lag
    ran = runs(tmp_path)
    runs_of = Counter(job_id for _p, kind, n, job_id, _a in ran if kind in ("parent", "pay"))
    # at-least-once: a job whose finalization was lost ran again, on the new primary
    assert all(runs_of[j] >= 2 for j in relost), {j: runs_of[j] for j in relost}
    effects = {r[0] for r in await rows(pair.standby_dsn, "SELECT n FROM public.failover_effects")}
    assert set(range(150, 170)) <= effects  # a lost consequence was applied again
    await assert_the_same_processes_moved(pair, launcher, pids, ran)


@pytest.mark.integration
async def test_a_switchover_leaves_the_fenced_primary_running_and_loses_nothing(
    pair, launchers, tmp_path
):
    await streaming(pair, "async")
    launcher, pids = start_workers(pair, launchers, tmp_path)
    # two callers whose pools hold a connection to the primary
    in_tx, inserting = awa.AsyncClient(pair.url), awa.AsyncClient(pair.url)
    try:
        await inserting.insert_many([FoParent(n) for n in range(60)])
        await inserting.insert_many([FoPay(n) for n in range(60, 70)])
        await in_tx.pool()
        # 20 finished on the primary (rows)
        await poll_until(
            lambda: _at_least(scalar(pair.primary_dsn, _COUNT_FINISHED), 20), 60, "work done"
        )
        # Fence the primary (it stays up, refusing writes), let the standby replay all it
        # wrote, promote the standby.
        await asyncio.to_thread(
            _run_sql,
            pair.primary_dsn,
            "ALTER SYSTEM SET default_transaction_read_only = on",
            "SELECT pg_reload_conf()",
        )
        fenced_at = await scalar(pair.primary_dsn, "SELECT pg_current_wal_lsn()::text")
        await poll_until(
            lambda: scalar(
                pair.standby_dsn, "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (fenced_at,)
            ),
            30,
            "the standby replayed up to the fence",
        )
        seen_before = await finished(pair.primary_dsn)
        await asyncio.to_thread(pair.standby.promote)
        # A caller's own transaction on its connection to the fenced server: refused, typed.
        with pytest.raises(awa.ReadOnlyDatabase):
            async with await in_tx.transaction() as tx:
                await tx.insert(FoParent(500))
        # An insert is retried on a new connection (nothing was written): the promoted server.
        late = await inserting.insert_many([FoParent(n) for n in range(1000, 1020)])
        assert inserting._pool.read_only_drains >= 1  # it met the fenced server, and left
    finally:
        await in_tx.close()
        await inserting.close()

    await poll_until(lambda: drained(pair.standby_dsn, 90), 90, "the queue drained")
    after = await finished(pair.standby_dsn)
    assert {j.id for j in late} <= set(after)
    for job_id, (kind, state, _n) in seen_before.items():  # nothing finalized was lost
        assert after.get(job_id, (kind, None, _n))[1] == state, (job_id, kind, state)
    assert_follow_ups_exact(after)
    assert len([j for j, (k, _s, _n) in after.items() if k != "fo_child"]) == 90
    assert set(range(60, 70)) <= {
        r[0] for r in await rows(pair.standby_dsn, "SELECT n FROM public.failover_effects")
    }
    # Every process left the fenced server, which is still up: its listener, heartbeat,
    # election and pool connections are on the promoted one, none on the fenced one.
    await assert_the_same_processes_moved(pair, launcher, pids, runs(tmp_path))
    names = [f"failover_{pid}" for pid in pids.values()]
    await poll_until(
        lambda: _is(
            scalar(
                pair.primary_dsn,
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = ANY(%s)",
                (names,),
            ),
            0,
        ),
        30,
        "no connection of the workers left on the fenced server",
    )


@pytest.mark.parametrize(
    "url",
    [
        "host=a,b port=5432,5433 dbname=app",
        "postgresql://a:5432,b:5433/app",
        "postgresql://a,b/app?target_session_attrs=any",
        "host=a,b dbname=app target_session_attrs=prefer-standby",
    ],
)
def test_several_hosts_without_a_writable_target_are_refused(url):
    with pytest.raises(ConfigError) as info:
        awa.AsyncClient(url)
    assert info.value.field == "database_url" and "target_session_attrs" in str(info.value)


def test_several_hosts_asking_for_the_writable_one_are_accepted():
    from awa_fast import primary

    for url in (
        "host=a,b port=1,2 dbname=app target_session_attrs=read-write",
        "postgresql://a:1,b:2/app?target_session_attrs=primary",
        "host=a dbname=app",
    ):
        primary.check_url(url, "database_url")  # no error
    assert primary.wants_primary("postgresql://a,b/app?target_session_attrs=read-write")
    assert not primary.wants_primary("host=a dbname=app")


@pytest.mark.integration
async def test_the_pool_keeps_reconnecting_after_its_reconnect_timeout():
    # psycopg_pool doubles its pauses until reconnect_timeout, then stops trying until a
    # caller asks; awa-fast's pool starts over at once (reconnect_failed), so it is connected
    # again soon after the server is back, however long it was down (ADR 035).
    server = start_temp()
    pool = Pool(server.dsn, min_size=1, max_size=2, reconnect_timeout=1.0, open=False)
    try:
        await pool.open(wait=True)
        async with pool.connection() as conn:  # the server's goodbye marks it closed
            await server_halted(server)
            with pytest.raises(psycopg.OperationalError):
                await conn.execute("SELECT 1")
        # the pool gave up twice and started over (an in-process counter)
        await poll_until(lambda: _true(pool.reconnects_failed >= 2), 30, "two give-ups")
        await asyncio.to_thread(server.restart)
        # an idle connection again, with no caller asking for one (the pool's own stats)
        await poll_until(
            lambda: _true(pool.get_stats().get("pool_available", 0) >= 1), 30, "reconnected"
        )
    finally:
        await pool.close()
        server.stop()


async def server_halted(server: TempServer) -> None:
    await asyncio.to_thread(server.halt, "immediate")


async def _true(value: bool) -> bool:
    return value


_COUNT_LAGGING = (
    "SELECT count(*) FROM awa_fast.jobs_all WHERE kind = 'fo_parent' AND (args->>'n')::int >= 1000"
)
_COUNT_FINISHED = "SELECT count(*) FROM awa_fast.jobs_all WHERE state IN ('completed', 'failed')"


def _run_sql(dsn: str, *statements: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


async def _is(awaitable, value) -> bool:
    return (await awaitable) == value


async def _at_least(awaitable, value) -> bool:
    return (await awaitable) >= value


async def _count_after(acked: dict[int, str]) -> bool:
    return sum(1 for phase in acked.values() if phase == "after") >= 30


async def _replayed_all(dsn: str) -> bool:
    # what the WAL receiver wrote is replayed (NULL before anything was received)
    return bool(await scalar(dsn, "SELECT pg_last_wal_replay_lsn() >= pg_last_wal_receive_lsn()"))
