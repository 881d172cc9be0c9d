"""Several worker hosts (issue 31): worker launchers (``awa-fast worker tests.hosts_app:client``,
the real CLI) in network namespaces of their own (bench/netns.py: a veth pair each, on a private
/30), connecting over TCP to a PostgreSQL in the root namespace that listens on the links'
addresses, directly or through a real PgBouncer in transaction mode (Debian's package, started
here, listening on the same addresses).

- Leadership moves between hosts: the leader's host is cut off (``ip link set <veth> down``)
  in the middle of a lease renewal and the other takes over; the cut host comes back, the new leader stops, and the first leads
  again. The leader does the leader's work (promotes a scheduled job) each time.
- A host's link is cut mid-run: its attempts are rescued and run by the other host; when the
  link returns, its zombie attempts finalize nothing. Counted per job, exactly: finalizations
  (an audit trigger on ``awa_fast.jobs_done``), staged follow-ups inserted, failure
  consequences applied (rows the effect writes in its settlement transaction).
- Partitioned queues spread over the hosts: each host serves some of a PartitionedQueue's
  partitions and runs exactly the jobs routed there.

Needs root, ``ip`` (iproute2) and ``pgbouncer``: ``.ci/run`` installs what is missing; a missing
one fails these tests, never skips them. Parallel-safe: namespaces and subnets are per process
(bench/netns.py allocates them under a lock) and removed in finalizers.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

import awa_fast as awa
from awa_fast.schema import migrate_sync
from bench.netns import Host, Hosts, NetnsError
from bench.server import TEST_SETTINGS, start_for_hosts
from tests.hosts_app import HOLD_KEY, SETUP_SQL, Hold, HoldSync, Next, Part
from tests.support import poll_until, running_bouncer, scalar, truncate, wait_lock_waiter

pytestmark = pytest.mark.integration  # starts servers of its own (no shared-server fixture)

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.hosts_app:client"


AUDIT_SQL = """
CREATE TABLE IF NOT EXISTS public.finalized (job_id bigint NOT NULL, state text NOT NULL,
    run_lease bigint NOT NULL);
CREATE OR REPLACE FUNCTION public.audit_finalized() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO public.finalized VALUES (NEW.id, NEW.state::text, NEW.run_lease);
    RETURN NULL;
END $$;
CREATE OR REPLACE TRIGGER audit_finalized AFTER INSERT ON awa_fast.jobs_done
    FOR EACH ROW EXECUTE FUNCTION public.audit_finalized();
TRUNCATE public.host_runs, public.released, public.finalized;
"""


# -- the machine: namespaces, a server listening on their links, PgBouncer -----------------------


@pytest.fixture(scope="module")
def net():
    """Two worker hosts (namespaces), removed afterwards whatever happened."""
    try:
        hosts = Hosts(2)
    except NetnsError as exc:  # no ip, not root: a failure, never a skip
        pytest.fail(f"{exc} (.ci/run installs iproute2; the tests run as root)")
    try:
        yield hosts
    finally:
        hosts.close()


@pytest.fixture(scope="module")
def server(net):
    """A server of this module's own listening on 127.0.0.1 and on every host's link, with a
    migrated ``awa`` database (``server.awa_dsn``)."""
    s = start_for_hosts(net.server_ips, [h.subnet for h in net], TEST_SETTINGS)
    try:
        with psycopg.connect(s.dsn, autocommit=True) as conn:
            conn.execute("CREATE DATABASE awa")
        s.awa_dsn = make_conninfo(s.dsn, dbname="awa")
        migrate_sync(s.awa_dsn)
        with psycopg.connect(s.awa_dsn, autocommit=True) as conn:
            conn.execute(SETUP_SQL)
        yield s
    finally:
        s.stop()


class Launcher:
    """One ``awa-fast worker`` launcher in a host's namespace (its own session, so that
    :meth:`kill` reaches its children too)."""

    def __init__(self, host: Host, argv: list[str], env: dict[str, str], logdir: Path):
        self.host = host
        self.stderr_path = logdir / f"{host.netns}-{len(os.listdir(logdir))}.err"
        with open(self.stderr_path, "w") as err:
            self.proc = subprocess.Popen(
                host.argv(argv),
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                start_new_session=True,
            )

    def log(self) -> str:
        """Everything it wrote on stderr (its children's logs)."""
        return self.stderr_path.read_text(errors="replace")

    async def stop(self, timeout: float = 60) -> int:
        """SIGTERM: drain (in-flight attempts finish or are given back, the finalizer flushed),
        then exit. Returns the exit status."""
        self.proc.send_signal(signal.SIGTERM)
        return await asyncio.to_thread(self.proc.wait, timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


class Deployment:
    """The database as the hosts see it: directly, or through PgBouncer (``bouncer``)."""

    def __init__(self, mode: str, net: Hosts, server, bouncer=None):
        self.mode, self.net, self.server, self.bouncer = mode, net, server, bouncer
        self.dsn = server.awa_dsn  # the test's own connections (root namespace, direct)
        self.launchers: list[Launcher] = []
        self.logdir = Path(tempfile.mkdtemp(prefix="awa-hosts-"))

    def direct_url(self, host: Host) -> str:
        return make_conninfo(self.dsn, host=host.server_ip)

    def url(self, host: Host) -> str:
        """The URL ``host``'s workers use."""
        if self.bouncer is None:
            return self.direct_url(host)
        return self.bouncer.url(self.dsn, host.server_ip)

    def start(self, host: Host, queues: str) -> Launcher:
        base = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("AWA_FAST_", "DATABASE_URL", "PYTEST_"))
        }
        env = {
            **base,
            "PYTHONPATH": os.pathsep.join(sys.path),
            "AWA_FAST_HOSTS_NAME": host.netns,
            "AWA_FAST_HOSTS_DIRECT": self.direct_url(host),
            **({"AWA_FAST_POOLER": "transaction"} if self.bouncer is not None else {}),
        }
        argv = [
            sys.executable, "-m", "awa_fast", "worker", APP,
            "--database-url", self.url(host), "--processes", "1", "--queues", queues,
            "--drain-timeout", "20", "--status-interval", "3600",
        ]  # fmt: skip
        launcher = Launcher(host, argv, env, self.logdir)
        self.launchers.append(launcher)
        return launcher

    def logs(self) -> str:
        return "\n".join(f"--- {la.host.netns} ---\n{la.log()[-3000:]}" for la in self.launchers)

    def cleanup(self) -> None:
        for launcher in self.launchers:
            launcher.kill()
        self.launchers.clear()
        for host in self.net:
            self.net.restore(host)


@pytest.fixture(scope="module", params=["direct", "pgbouncer"])
def deployment(request, net, server):
    with contextlib.ExitStack() as stack:
        bouncer = None
        if request.param == "pgbouncer":
            bouncer = stack.enter_context(
                running_bouncer(server.dsn, "transaction", listen=net.server_ips)
            )
        d = Deployment(request.param, net, server, bouncer)
        stack.callback(shutil.rmtree, d.logdir, True)
        yield d


@pytest.fixture
async def hosts(deployment):
    """The deployment with an empty database (audit trigger installed); every launcher a test
    started is killed and every link restored afterwards, whatever happened."""
    await truncate(deployment.dsn)
    async with await psycopg.AsyncConnection.connect(deployment.dsn, autocommit=True) as conn:
        await conn.execute(AUDIT_SQL)
    try:
        yield deployment
    finally:
        deployment.cleanup()


# -- reading the database -------------------------------------------------------------------------


async def rows(dsn: str, query: str, params=None) -> list[tuple]:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        return await (await conn.execute(query, params)).fetchall()


async def lease(d: Deployment) -> tuple[int, Host | None, bool]:
    """The leader lease: its epoch, the host its holder runs on, whether it is live."""
    ((epoch, holder, live),) = await rows(
        d.dsn, "SELECT epoch, holder, expires_at > now() FROM awa_fast.leader_lease"
    )
    host = d.net.host_of(int(holder.rsplit(" ", 1)[1])) if holder else None
    return epoch, host, bool(live)


async def led_by(d: Deployment, host: Host, above: int = 0, timeout: float = 60) -> int:
    """Wait until ``host`` holds a live lease at an epoch above ``above``; its epoch.
    Polled: the launchers' children lead, nothing of this process reports it."""

    async def check():
        epoch, holder, live = await lease(d)
        return epoch if live and holder == host and epoch > above else None

    try:
        return await poll_until(check, timeout, f"{host.netns} leading above epoch {above}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{await diagnosis(d)}") from None


async def diagnosis(d: Deployment) -> str:
    """What a failed wait shows: the lease, the server's sessions, the launchers' logs."""
    sessions = await rows(
        d.dsn,
        "SELECT pid, host(client_addr), state, wait_event, round(extract(epoch FROM "
        "now() - state_change)::numeric, 1), left(query, 70) FROM pg_stat_activity "
        "WHERE datname = current_database() AND pid <> pg_backend_pid() ORDER BY 2, 1",
    )
    return "\n".join(
        [
            f"lease: {await rows(d.dsn, 'SELECT * FROM awa_fast.leader_lease')}",
            *map(str, sessions),
            d.logs(),
        ]
    )


async def scheduled_job_runs(d: Deployment, client: awa.AsyncClient, n: int) -> None:
    """A job scheduled a moment ahead completes: only a leader promotes it."""
    job = await client.insert(Next(n), run_at=datetime.now(UTC) + timedelta(seconds=0.5))
    assert job.state == awa.JobState.Scheduled
    await poll_until(  # polled: another process runs it
        lambda: scalar(
            d.dsn, "SELECT state = 'completed' FROM awa_fast.jobs_all WHERE id = %s", (job.id,)
        ),
        60,
        f"scheduled job {job.id} promoted and completed",
    )


# -- leadership ----------------------------------------------------------------------------------


async def test_leadership_moves_between_hosts(hosts):
    d = hosts
    a, b = d.net
    launchers = {a: d.start(a, "default:4"), b: d.start(b, "default:4")}
    async with awa.AsyncClient(d.dsn) as client:
        # polled: the launchers' children take the lease
        async def someone_leads():
            epoch, holder, live = await lease(d)
            return (epoch, holder) if live and holder is not None else None

        first_epoch, first = await poll_until(someone_leads, 60, "a leader on either host")
        second = b if first == a else a
        await scheduled_job_runs(d, client, 1)

        # The leader's host drops off the network in the middle of a lease renewal: the test
        # holds the lease row, so the renewal waits on it; the host is cut; the row is let go.
        # The renewal's UPDATE completes on the server, but neither its answer nor the COMMIT
        # ever travels: the session stays idle in a transaction that holds the row (and,
        # directly connected, the advisory lock) until the server ends it (ADR 039).
        async with await psycopg.AsyncConnection.connect(d.dsn) as holder:
            async with holder.transaction():
                await holder.execute("SELECT FROM awa_fast.leader_lease FOR UPDATE")
                await wait_lock_waiter(d.dsn, query_like="%leader_lease l SET expires_at%")
                d.net.cut(first)
        second_epoch = await led_by(d, second, above=first_epoch)
        await scheduled_job_runs(d, client, 2)

        d.net.restore(first)
        assert await launchers[second].stop() == 0, d.logs()  # the second leader stops
        await led_by(d, first, above=second_epoch)
        await scheduled_job_runs(d, client, 3)
        assert await launchers[first].stop() == 0, d.logs()


# -- a host cut off mid-run ----------------------------------------------------------------------


async def test_a_cut_hosts_attempts_are_rescued_and_its_zombies_finalize_nothing(hosts):
    """Host A claims every job; its link goes down. A's async handlers are cancelled when no
    heartbeat commits for the staleness; its ``def`` handlers (threads, which nothing can stop)
    keep waiting on a lock over the cut connection. Host B takes over the leadership, rescues
    them and runs them again: ok jobs complete and stage one follow-up each, failing jobs apply
    their consequence once (on their last attempt, or through rescue on a final attempt). Then
    the link returns and the lock is released: A's threads run to their end and every attempt
    of A's is given back under its old run lease: nothing changes, per job, exactly."""
    d = hosts
    a, b = d.net
    async with (
        awa.AsyncClient(d.dsn) as client,
        await psycopg.AsyncConnection.connect(d.dsn, autocommit=True) as lock,
    ):
        await lock.execute("SELECT pg_advisory_lock(%s)", (HOLD_KEY,))
        ok_ns = [0, 1, 2, 10, 11, 12]
        ok = [await client.insert(Hold(n) if n < 10 else HoldSync(n)) for n in ok_ns]
        fail_late = [
            await client.insert(HoldSync(20 + i, "fail"), max_attempts=2) for i in range(2)
        ]
        fail_rescued = [await client.insert(Hold(30 + i, "fail"), max_attempts=1) for i in range(2)]
        fail_rescued += [
            await client.insert(HoldSync(40 + i, "fail"), max_attempts=1) for i in range(2)
        ]
        jobs = ok + fail_late + fail_rescued
        ids = [j.id for j in jobs]
        sync_ids = [j.id for j in jobs if j.kind == "hold_sync"]

        launcher_a = d.start(a, "default:16")

        async def a_holds_everything():  # polled: host A's children claim and wait
            running = await scalar(
                d.dsn,
                "SELECT count(*) FROM awa_fast.jobs WHERE state = 'running' AND attempt = 1 "
                "AND id = ANY(%s)",
                (ids,),
            )
            waiting = await scalar(
                d.dsn,
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
                "AND objid = %s",
                (HOLD_KEY,),
            )
            return running == len(ids) and waiting == len(sync_ids)

        await poll_until(a_holds_everything, 60, "host A running every job")
        epoch = await led_by(d, a)  # the only host so far

        launcher_b = d.start(b, "default:16")
        d.net.cut(a)
        await led_by(d, b, above=epoch)

        async def settled():  # polled: host B's children rescue and run
            return await scalar(
                d.dsn,
                "SELECT count(*) = %s FROM awa_fast.jobs_all WHERE id = ANY(%s) "
                "AND state IN ('completed', 'failed')",
                (len(ids), ids),
            )

        await poll_until(settled, 90, "every job settled by host B")

        async def follow_ups_done():
            return await scalar(
                d.dsn,
                "SELECT count(*) = %s FROM awa_fast.jobs_all WHERE kind = 'next' "
                "AND state = 'completed'",
                (len(ok),),
            )

        await poll_until(follow_ups_done, 60, "the follow-ups completed")

        async def tally() -> dict:
            return {
                "jobs": await rows(
                    d.dsn,
                    "SELECT id, state::text, attempt, run_lease FROM awa_fast.jobs_all "
                    "WHERE id = ANY(%s) ORDER BY id",
                    (ids,),
                ),
                "finalized": await rows(
                    d.dsn,
                    "SELECT job_id, count(*) FROM public.finalized WHERE job_id = ANY(%s) "
                    "GROUP BY job_id ORDER BY job_id",
                    (ids,),
                ),
                "follow_ups": await rows(
                    d.dsn,
                    "SELECT (args->>'n')::int, count(*) FROM awa_fast.jobs_all "
                    "WHERE kind = 'next' GROUP BY 1 ORDER BY 1",
                ),
                "released": await rows(
                    d.dsn,
                    "SELECT job_id, host, reason, count(*) FROM public.released "
                    "GROUP BY 1, 2, 3 ORDER BY 1",
                ),
            }

        before = await tally()
        states = {i: s for i, s, _, _ in before["jobs"]}
        assert {states[j.id] for j in ok} == {"completed"}
        assert {states[j.id] for j in fail_late + fail_rescued} == {"failed"}
        assert before["finalized"] == [(i, 1) for i in sorted(ids)]
        assert before["follow_ups"] == [(n, 1) for n in ok_ns]
        assert before["released"] == sorted(
            [(j.id, b.netns, "terminal_error", 1) for j in fail_late]
            + [(j.id, b.netns, "rescue_exhausted", 1) for j in fail_rescued]
        )
        # every run so far was host B's, on a later attempt (A's first attempts never ended)
        runs = await rows(
            d.dsn, "SELECT DISTINCT host, attempt > 1 FROM public.host_runs WHERE kind <> 'next'"
        )
        assert runs == [(b.netns, True)]

        d.net.restore(a)
        await lock.execute("SELECT pg_advisory_unlock(%s)", (HOLD_KEY,))

        async def zombies_ended():  # polled: A's handler threads record their end
            return await scalar(
                d.dsn,
                "SELECT count(*) = %s FROM public.host_runs WHERE host = %s AND attempt = 1",
                (len(sync_ids), a.netns),
            )

        await poll_until(zombies_ended, 90, "host A's zombie threads ended")
        # the drain waits for those threads, gives their attempts back and flushes
        assert await launcher_a.stop() == 0, d.logs()
        assert await tally() == before, d.logs()
        assert "no heartbeat committed" in launcher_a.log(), d.logs()  # async handlers cancelled
        assert await launcher_b.stop() == 0, d.logs()


# -- partitioned queues --------------------------------------------------------------------------


async def test_partitioned_queues_spread_over_the_hosts(hosts):
    """Each host serves two of a PartitionedQueue's four partitions: every job runs on the host
    serving the partition its key routes to, and is finalized exactly once."""
    d = hosts
    a, b = d.net
    pq = awa.PartitionedQueue("spread", 4)
    serves = {a: pq.physical_queues[:2], b: pq.physical_queues[2:]}
    for host, queues in serves.items():
        d.start(host, ",".join(f"{q}:4" for q in queues))
    async with awa.AsyncClient(d.dsn) as client:
        keys = [f"customer-{i}" for i in range(12)]
        jobs = [
            await client.insert(Part(key, n), **pq.route_by_key(key))
            for n in range(3)
            for key in keys
        ]
    assert {j.queue for j in jobs} == set(pq.physical_queues)  # every partition has work
    ids = [j.id for j in jobs]

    async def done():  # polled: the hosts' children run them
        return await scalar(
            d.dsn,
            "SELECT count(*) = %s FROM awa_fast.jobs_all WHERE id = ANY(%s) AND state = 'completed'",
            (len(ids), ids),
        )

    await poll_until(done, 90, "every partitioned job completed")
    host_of_queue = {q: h.netns for h, qs in serves.items() for q in qs}
    runs = await rows(d.dsn, "SELECT job_id, queue, host FROM public.host_runs")
    assert {r[0] for r in runs} == set(ids)
    assert all(host == host_of_queue[queue] for _, queue, host in runs), runs
    assert {host for _, _, host in runs} == {a.netns, b.netns}
    finalized = await rows(
        d.dsn, "SELECT job_id, count(*) FROM public.finalized GROUP BY 1 ORDER BY 1"
    )
    assert finalized == [(i, 1) for i in sorted(ids)]
    for launcher in d.launchers:
        assert await launcher.stop() == 0, d.logs()
