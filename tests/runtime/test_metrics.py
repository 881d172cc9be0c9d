"""Prometheus metrics (awa_fast.metrics) scraped over HTTP from real workers and checked against
the rows: the launcher's aggregated endpoint over 2 children, and a library runtime's own."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import socket
import urllib.request

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

import awa_fast as awa
from awa_fast.errors import ConfigError
from tests.metrics_app import Charge, Step
from tests.runtime.test_launcher import Launcher, clean, launchers, poll  # noqa: F401 - fixtures
from tests.support import poll_until, scalar, until, wait_state

FINAL = ("completed", "failed", "cancelled")


def scrape(url: str) -> dict:
    """``{(sample name, labels without pid): value}``, summed over the children's pids."""
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    out: dict = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "pid"))
            out[(s.name, labels)] = out.get((s.name, labels), 0) + s.value
    return out


def total(samples: dict, name: str, **labels: str) -> float:
    """Sum of ``name`` over the samples whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= set(ls))


def rows(dsn: str, query: str) -> int:
    with psycopg.connect(dsn) as conn:
        return conn.execute(query).fetchone()[0]


def test_launcher_aggregates_its_children_and_the_counts_match_the_rows(dsn, launchers):
    with awa.Client(dsn) as c:
        for mode, tags in (
            ("ok", [""] * 6),
            ("stage", ["a", "a", "b", "c", "c", "c"]),
            ("stage_fail", ["x", "y"]),
            ("retry", [""] * 3),
            ("cancel", [""] * 2),
        ):
            for tag in tags:
                c.insert(Step(mode, tag), queue="metrics_q")
        c.insert(Step("wait", "w"), queue="metrics_q", max_attempts=1)
        for amount in (1, 2):
            c.insert(Charge(amount), queue="metrics_q")
    launcher = Launcher(
        dsn, "--processes", "2", "--metrics-port", "0", app="tests.metrics_app:client"
    )
    launchers.append(launcher)
    m = launcher.wait_line(r"metrics of all children at (\S+) \(directory (\S+)\)")
    url, directory = m.group(1), m.group(2)
    launcher.ready_pids(2)
    # During the run: one child takes the leadership, and the endpoint says so.
    poll(lambda: total(scrape(url), "awa_fast_maintenance_leader") == 1, 30, "a leader")

    poll(
        lambda: (
            rows(
                dsn,
                "SELECT count(*) FROM awa_fast.jobs_all WHERE kind IN ('step', 'charge') "
                "AND state NOT IN ('completed', 'failed', 'cancelled')",
            )
            == 0
        ),
        30,
        "every trigger job final",
    )
    expected = {
        o: rows(
            dsn,
            f"SELECT count(*) FROM awa_fast.jobs_all WHERE kind IN ('step', 'charge') "
            f"AND state = '{o}'",
        )
        for o in FINAL
    }
    children = rows(dsn, "SELECT count(*) FROM awa_fast.jobs_all WHERE kind = 'child'")
    assert expected == {"completed": 15, "failed": 5, "cancelled": 2} and children == 3
    # The waiting job was failed by the callback rescue, not by a finalize.
    by_rescue = rows(
        dsn,
        "SELECT count(*) FROM awa_fast.jobs_all WHERE args->>'mode' = 'wait' "
        "AND state = 'failed' AND errors::text LIKE '%%callback%%'",
    )
    assert by_rescue == 1
    finalized_expected = {
        **expected,
        "failed": expected["failed"] - by_rescue,
        "waiting_external": 1,
    }

    def settled():  # the endpoint shows every finalize and a refreshed queue depth
        s = scrape(url)
        done = all(
            total(s, "awa_fast_jobs_finalized_total", outcome=o) == n
            for o, n in finalized_expected.items()
        )
        depth = total(s, "awa_fast_queue_depth", queue="metrics_children", state="available")
        return s if done and depth == children else None

    s = poll(settled, 30, "the endpoint to show every finalize and the queue depth")
    assert total(s, "awa_fast_jobs_finalized_total", outcome="retryable") == rows(
        dsn, "SELECT count(*) FROM awa_fast.jobs_all WHERE args->>'mode' = 'retry' AND attempt = 2"
    )
    assert total(s, "awa_fast_jobs_finalized_total", kind="charge", outcome="failed") == 2
    assert total(s, "awa_fast_follow_ups_inserted_total") == children
    assert total(s, "awa_fast_follow_ups_skipped_total") == 6 - children
    assert total(s, "awa_fast_follow_ups_discarded_total", outcome="failed") == rows(
        dsn,
        "SELECT count(*) FROM awa_fast.jobs_all WHERE args->>'mode' = 'stage_fail' "
        "AND state = 'failed'",
    )
    assert total(s, "awa_fast_rescues_total", cause="callback") == by_rescue
    assert total(s, "awa_fast_follow_ups_discarded_total", outcome="waiting_external") == 1
    assert total(s, "awa_fast_staged_discarded_on_wait_for_callback_total") == 1
    assert (
        total(s, "awa_fast_consequences_applied_total", kind="charge")
        == rows(dsn, "SELECT count(*) FROM awa_fast.jobs_all WHERE consequence_state = 'applied'")
        == 2
    )
    assert total(s, "awa_fast_consequences_owed") == 0
    assert total(s, "awa_fast_queue_depth", queue="metrics_q", state="available") == 0
    finalized = sum(
        total(s, "awa_fast_jobs_finalized_total", outcome=o)
        for o in (*FINAL, "retryable", "waiting_external")
    )
    assert total(s, "awa_fast_finalize_seconds_count") == finalized
    assert total(s, "awa_fast_claim_seconds_count") >= 1
    assert total(s, "awa_fast_maintenance_leader") == 1  # one leader among the live children

    launcher.proc.send_signal(signal.SIGTERM)
    assert launcher.wait() == 0, launcher.transcript()
    assert not os.path.exists(directory)  # the run's multiprocess directory is removed


def test_killed_child_keeps_its_counts_and_its_job_is_rescued_by_heartbeat(dsn, launchers):
    """SIGKILL the only child mid-job: its counters survive in the run's directory, its live
    leadership gauge goes (mark_process_dead), its restarted successor rescues the attempt."""
    with awa.Client(dsn) as c:
        oks = [c.insert(Step("ok"), queue="metrics_q").id for _ in range(3)]
        hang = c.insert(Step("hang"), queue="metrics_q").id
    launcher = Launcher(
        dsn, "--processes", "1", "--metrics-port", "0", app="tests.metrics_app:client"
    )
    launchers.append(launcher)
    url = launcher.wait_line(r"metrics of all children at (\S+)").group(1)
    pid = launcher.ready_pids(1)[0]
    poll(
        lambda: (
            rows(
                dsn,
                f"SELECT count(*) FROM awa_fast.jobs_all WHERE id = ANY(ARRAY{oks}) "
                "AND state = 'completed'",
            )
            == 3
            and rows(
                dsn,
                f"SELECT count(*) FROM awa_fast.jobs_all WHERE id = {hang} AND state = 'running'",
            )
            == 1
        ),
        30,
        "3 completed, 1 running",
    )
    poll(
        lambda: (
            lambda s: (
                total(s, "awa_fast_jobs_finalized_total", outcome="completed") == 3
                and total(s, "awa_fast_maintenance_leader") == 1
            )
        )(scrape(url)),
        30,
        "the first child's counts and leadership",
    )

    os.kill(pid, signal.SIGKILL)
    assert launcher.wait_line(r"child 0 pid (\d+) ready").group(1) != str(pid)
    poll(
        lambda: (
            rows(
                dsn,
                f"SELECT count(*) FROM awa_fast.jobs_all WHERE id = {hang} "
                "AND state = 'completed' AND attempt = 2",
            )
            == 1
        ),
        30,
        "the hung job rescued and completed",
    )

    def after():
        s = scrape(url)
        ok = (
            total(s, "awa_fast_rescues_total", cause="heartbeat") == 1
            and total(s, "awa_fast_jobs_finalized_total", outcome="completed") == 4
        )
        return s if ok else None

    s = poll(after, 30, "the rescue and the dead child's completions on the endpoint")
    leader = {ls: v for (n, ls), v in s.items() if n == "awa_fast_maintenance_leader"}
    assert sum(leader.values()) == 1, leader  # the dead child's gauge is gone
    launcher.proc.send_signal(signal.SIGTERM)
    assert launcher.wait() == 0, launcher.transcript()


@dataclasses.dataclass
class Hang:
    n: int


@dataclasses.dataclass
class Owe:
    n: int


async def test_library_runtime_serves_its_own_endpoint(dsn, client):
    """metrics_port on start(): this process's series, including a deadline rescue and an owed
    consequence (its effect keeps failing)."""

    @client.task(Hang, queue="metrics_lib")
    async def hang(job):
        if job.attempt == 1:
            await asyncio.Event().wait()

    async def broken_refund(failure: awa.JobFailure) -> None:
        raise RuntimeError("the refund service is down")

    @client.task(Owe, queue="metrics_lib", failure_consequence=broken_refund)
    async def owe(job):
        raise awa.TerminalError("declined")

    job = await client.insert(Hang(1), queue="metrics_lib", max_attempts=3)
    owing = await client.insert(Owe(1), queue="metrics_lib")
    await client.start(
        [{"name": "metrics_lib", "max_workers": 1, "deadline_duration_ms": 200}],
        poll_interval_ms=50,
        promote_interval_ms=50,
        leader_election_interval_ms=100,
        deadline_rescue_interval_ms=100,
        metrics_port=0,
        metrics_refresh_ms=100,
    )
    exporter = client.runtime.metrics_exporter
    await wait_state(client, job.id, "completed")
    await until(
        lambda: scalar(
            dsn, f"SELECT consequence_state = 'owed' FROM awa_fast.jobs_all WHERE id = {owing.id}"
        ),
        client,
        15,
        "the consequence owed",
    )

    async def rescued():
        s = await asyncio.to_thread(scrape, exporter.url)
        ok = (
            total(s, "awa_fast_rescues_total", cause="deadline") >= 1
            and total(s, "awa_fast_consequences_owed") == 1
            and total(s, "awa_fast_jobs_finalized_total", queue="metrics_lib", outcome="completed")
            == 1
            and total(s, "awa_fast_maintenance_leader") == 1
        )
        return s if ok else None

    # polled: the endpoint's gauges follow the metrics loop's own cadence (metrics_refresh_ms)
    await poll_until(
        rescued, 15, "a deadline rescue, the completion and leadership on the endpoint"
    )
    await client.shutdown()
    with pytest.raises(OSError):  # the endpoint stops with the runtime
        await asyncio.to_thread(urllib.request.urlopen, exporter.url, None, 2)


async def test_metrics_options_are_validated(client, monkeypatch):
    @client.task(Hang, queue="metrics_bad")
    async def hang(job):
        return None

    for bad in ("9100", -1, 70000, True):
        with pytest.raises(ConfigError, match="metrics_port"):
            await client.start([("metrics_bad", 1)], metrics_port=bad)
    with pytest.raises(ConfigError, match="metrics_host"):
        await client.start([("metrics_bad", 1)], metrics_port=0, metrics_host="")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(ConfigError, match="cannot listen"):
            await client.start([("metrics_bad", 1)], metrics_port=taken.getsockname()[1])
    assert client.runtime is None
    monkeypatch.setenv("AWA_FAST_LAUNCHER_METRICS", "1")  # as in a launcher's child
    with pytest.raises(ConfigError, match="aggregated by the launcher"):
        await client.start([("metrics_bad", 1)], metrics_port=0)


async def test_metrics_options_without_a_port_are_rejected(client, monkeypatch):
    """metrics_host / metrics_refresh_ms configure the endpoint: without metrics_port they
    would be unused, so start() rejects them; a launcher's child may refresh (for the
    launcher's endpoint)."""

    @client.task(Hang, queue="metrics_noport")
    async def hang(job):
        return None

    monkeypatch.delenv("AWA_FAST_LAUNCHER_METRICS", raising=False)
    for option in (dict(metrics_host="127.0.0.1"), dict(metrics_refresh_ms=100)):
        (field,) = option
        with pytest.raises(ConfigError, match=f"{field}=.*no metrics_port") as info:
            await client.start([("metrics_noport", 1)], **option)
        assert info.value.field == field
    assert client.runtime is None
    monkeypatch.setenv("AWA_FAST_LAUNCHER_METRICS", "refresh")  # as in a launcher's child 0
    runtime, _ = client._runtime_for([("metrics_noport", 1)], dict(metrics_refresh_ms=100))
    assert runtime.metrics_refresh_s == 0.1
    with pytest.raises(ConfigError, match="metrics_host"):
        client._runtime_for([("metrics_noport", 1)], dict(metrics_host="127.0.0.1"))


def test_launcher_metrics_host_errors_are_usage_errors(dsn, launchers):
    """An empty --metrics-host, or one without --metrics-port (it would be unused): exit 2
    with the reason, no child started."""
    for args, reason in (
        (("--metrics-port", "0", "--metrics-host", ""), "--metrics-host must be a non-empty"),
        (("--metrics-host", "127.0.0.2"), "--metrics-host 127.0.0.2 needs --metrics-port"),
    ):
        launcher = Launcher(dsn, "--processes", "1", *args, app="tests.metrics_app:client")
        launchers.append(launcher)
        assert launcher.wait() == 2
        out = launcher.transcript()
        assert reason in out and "start" not in out, out


def test_launcher_metrics_port_errors_are_usage_errors(dsn, launchers):
    """A port out of range or already taken: exit 2 with the reason, no child started."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        for port, reason in (
            ("70000", "must be in 0..65535"),
            (str(taken.getsockname()[1]), "cannot listen on 127.0.0.1"),
        ):
            launcher = Launcher(
                dsn, "--processes", "1", "--metrics-port", port, app="tests.metrics_app:client"
            )
            launchers.append(launcher)
            assert launcher.wait() == 2
            out = launcher.transcript()
            assert reason in out and "started" not in out, out


def test_launcher_endpoint_skips_a_file_a_child_created_and_never_sized():
    """A child creates its ``.db`` file and sizes it a moment later; killed in between, it
    leaves a 0-byte file for good, and ``prometheus_client``'s own collector then failed every
    scrape with HTTP 500 (prometheus/client_python issue 1199). The launcher's endpoint serves
    the other children's metrics."""
    import subprocess
    import sys

    from awa_fast.metrics import MULTIPROC_ENV, LauncherExporter

    exporter = LauncherExporter(0)
    try:
        child = (
            "from prometheus_client import Counter; "
            "Counter('awa_fast_test_done', 'a child counter').inc(3)"
        )
        env = {**os.environ, MULTIPROC_ENV: exporter.directory}
        subprocess.run([sys.executable, "-c", child], env=env, check=True, timeout=60)
        open(os.path.join(exporter.directory, "counter_4194304.db"), "wb").close()
        assert total(scrape(exporter.url), "awa_fast_test_done_total") == 3
    finally:
        exporter.close()


def test_a_dead_childs_counters_and_histograms_fold_into_one_file_per_type():
    """Each child restart left its counter and histogram files in the run's directory for good,
    and every scrape merged them all (52 ms with none, about 2 s after 200 restarts). A child's
    exit folds them into one archive file per type: the directory stops growing and every sum
    stays what it was."""
    import subprocess
    import sys

    from awa_fast.metrics import MULTIPROC_ENV, LauncherExporter

    exporter = LauncherExporter(0)
    child = (
        "import sys; from prometheus_client import Counter, Histogram; "
        "n = int(sys.argv[1]); "
        "Counter('awa_fast_test_done', 'done', ['outcome']).labels(sys.argv[2]).inc(n); "
        "Histogram('awa_fast_test_seconds', 'seconds', buckets=(0.1, 1.0)).observe(n / 10)"
    )
    env = {**os.environ, MULTIPROC_ENV: exporter.directory}

    def run(n: int, outcome: str) -> int:
        proc = subprocess.Popen([sys.executable, "-c", child, str(n), outcome], env=env)
        assert proc.wait(timeout=60) == 0
        return proc.pid

    def files() -> list[str]:
        return sorted(f for f in os.listdir(exporter.directory) if f.endswith(".db"))

    try:
        dead = [run(n, outcome) for n, outcome in ((1, "a"), (5, "b"), (2, "a"), (30, "c"))]
        before = scrape(exporter.url)
        assert total(before, "awa_fast_test_done_total", outcome="a") == 3
        assert total(before, "awa_fast_test_seconds_count") == 4
        assert len(files()) == 8
        for pid in dead[:3]:
            exporter.child_exited(pid)
        assert files() == [
            f"counter_{dead[3]}.db",  # a process not reported dead keeps its own files
            "counter_archive.db",
            f"histogram_{dead[3]}.db",
            "histogram_archive.db",
        ]
        exporter.child_exited(dead[3])
        assert files() == ["counter_archive.db", "histogram_archive.db"]
        after = scrape(exporter.url)
        assert after == pytest.approx(before)  # the same sums, added in another order
        assert total(after, "awa_fast_test_seconds_bucket", le="0.1") == 1
        assert total(after, "awa_fast_test_seconds_bucket", le="1.0") == 3
        assert total(after, "awa_fast_test_seconds_sum") == pytest.approx(3.8)
        exporter.child_exited(dead[0])  # reported twice: nothing left to fold
        assert scrape(exporter.url) == pytest.approx(before)
    finally:
        exporter.close()
