"""The multi-process launcher (``awa-fast worker module:client``) on a real PostgreSQL: graceful
drain on SIGTERM loses nothing, a SIGKILLed child is restarted and its jobs rescued, exactly one
child holds the maintenance leader lock (and another takes over when it dies), a crash loop ends
with a non-zero exit.

The launcher runs ``tests.launcher_app:client`` as a subprocess from the repository root; the
tests wait on its status lines and poll the database (bounded)."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psycopg
import pytest

from awa_fast import sql
from awa_fast.supervisor import kill_after_s, parse_queues_arg
from tests.launcher_app import DefNap, Nap
from tests.support import sigint_as_at_a_terminal

ROOT = Path(__file__).resolve().parents[2]
KIND = "nap"
QUEUE = "launch_q"


class Launcher:
    """``python -m awa_fast worker tests.launcher_app:client ...`` with its stdout lines queued."""

    def __init__(
        self,
        dsn: str,
        *args: str,
        fail: str | None = None,
        app: str = "tests.launcher_app:client",
        env: dict | None = None,
        global_args: tuple[str, ...] = (),
    ):
        extra = env or {}
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("AWA_FAST_DATABASE_URL", "DATABASE_URL")
        }
        env["AWA_FAST_LAUNCHER_DSN"] = dsn
        env.update(extra)
        if fail:
            env["AWA_FAST_LAUNCHER_FAIL"] = fail
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "awa_fast", *global_args, "worker", app, *args],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue = queue.Queue()
        self.seen: list[str] = []
        self.stderr: list[str] = []
        threading.Thread(
            target=self._pump, args=(self.proc.stdout, self.lines), daemon=True
        ).start()
        err: queue.Queue = queue.Queue()
        threading.Thread(target=self._pump, args=(self.proc.stderr, err), daemon=True).start()
        self._err = err

    @staticmethod
    def _pump(stream, q) -> None:
        for line in stream:
            q.put(line.rstrip("\n"))
        q.put(None)

    def wait_line(self, pattern: str, timeout: float = 30.0) -> re.Match:
        """The next stdout line matching ``pattern`` (earlier non-matching lines are kept in
        ``seen``)."""
        rx = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(
                    f"no line matching {pattern!r} in {timeout}s; seen:\n"
                    + "\n".join(self.seen)
                    + "\nstderr:\n"
                    + self.drain_stderr()
                )
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                raise AssertionError(
                    f"launcher output ended before {pattern!r}; seen:\n"
                    + "\n".join(self.seen)
                    + "\nstderr:\n"
                    + self.drain_stderr()
                )
            self.seen.append(line)
            m = rx.search(line)
            if m:
                return m

    def drain_stderr(self) -> str:
        while True:
            try:
                line = self._err.get_nowait()
            except queue.Empty:
                break
            if line is not None:
                self.stderr.append(line)
        return "\n".join(self.stderr[-40:])

    def ready_pids(self, n: int) -> dict[int, int]:
        """Wait for ``n`` children to report ready: ``{index: pid}``."""
        pids: dict[int, int] = {}
        while len(pids) < n:
            m = self.wait_line(r"child (\d+) pid (\d+) ready")
            pids[int(m.group(1))] = int(m.group(2))
        return pids

    def wait(self, timeout: float = 60.0) -> int:
        return self.proc.wait(timeout=timeout)

    def transcript(self) -> str:
        """Everything the launcher printed so far (for assertion messages)."""
        while True:
            try:
                line = self.lines.get_nowait()
            except queue.Empty:
                break
            if line is not None:
                self.seen.append(line)
        return "stdout:\n" + "\n".join(self.seen) + "\nstderr:\n" + self.drain_stderr()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        # children live in their own process groups; a killed parent leaves them to notice
        # (they drain when their parent pid changes)


@pytest.fixture
def launchers():
    started: list[Launcher] = []
    yield started
    for launcher in started:
        launcher.stop()


@pytest.fixture(autouse=True)
def clean(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE awa_fast.jobs, awa_fast.queue_meta, awa_fast.dlq")


def enqueue(dsn: str, n: int, ms: int) -> None:
    import awa_fast as awa

    with awa.Client(dsn) as c:
        c.insert_many_copy([Nap(ms) for _ in range(n)], queue=QUEUE)


def counts(dsn: str) -> dict[str, int]:
    with psycopg.connect(dsn) as conn:
        return dict(
            conn.execute(
                "SELECT state::text, count(*) FROM awa_fast.jobs_all WHERE kind = %s GROUP BY 1",
                (KIND,),
            ).fetchall()
        )


def poll(fn, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def leader_backends(dsn: str) -> list[int]:
    """Backend pids holding the maintenance leader advisory lock in this database."""
    key = sql.LEADER_LOCK_KEY
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
            "AND classid = %s::oid AND objid = %s::oid AND objsubid = 1",
            (key >> 32, key & 0xFFFFFFFF),
        ).fetchall()
    return [r[0] for r in rows]


def test_parse_queues():
    assert parse_queues_arg("default:10, emails:4") == [("default", 10), ("emails", 4)]
    assert parse_queues_arg("solo") == [("solo", 10)]
    assert parse_queues_arg(None) is None and parse_queues_arg("") is None
    for bad in ("q:0", "q:x", ":3"):
        with pytest.raises(ValueError):
            parse_queues_arg(bad)


def test_graceful_drain_on_sigterm_loses_nothing(dsn, launchers):
    total = 200
    enqueue(dsn, total, 400)
    launcher = Launcher(dsn, "--processes", "2", "--queues", f"{QUEUE}:8", "--drain-timeout", "10")
    launchers.append(launcher)
    launcher.ready_pids(2)
    # mid-run: some finished, many in flight and many still waiting
    poll(lambda: counts(dsn).get("completed", 0) >= 16, 30, "16 completed")
    running_before = counts(dsn).get("running", 0)
    assert running_before > 0
    launcher.proc.send_signal(signal.SIGTERM)
    assert launcher.wait(60) == 0, launcher.transcript()
    launcher.wait_line(r"all children stopped", 5)
    final = counts(dsn)
    assert "running" not in final, final
    assert set(final) <= {"completed", "available"}, final
    assert sum(final.values()) == total  # none lost
    assert final.get("available", 0) > 0  # it stopped claiming
    # in-flight handlers were allowed to finish: no attempt was cut short and released
    with psycopg.connect(dsn) as conn:
        errors = conn.execute(
            "SELECT count(*) FROM awa_fast.jobs_all WHERE errors <> '[]'"
        ).fetchone()[0]
    assert errors == 0


def test_a_second_signal_kills_the_children_and_says_what_it_leaves(dsn, launchers):
    # the children died with "exited with code -9" and no word on the jobs (fresh eyes)
    enqueue(dsn, 2, 30_000)
    launcher = Launcher(dsn, "--processes", "1", "--queues", f"{QUEUE}:2", "--drain-timeout", "60")
    launchers.append(launcher)
    launcher.ready_pids(1)
    poll(lambda: counts(dsn).get("running", 0) == 2, 30, "both running")
    launcher.proc.send_signal(signal.SIGTERM)
    launcher.wait_line(r"draining 1 child", 10)
    launcher.proc.send_signal(signal.SIGTERM)
    launcher.wait_line(
        r"second signal: 1 child\(ren\) killed \(SIGKILL\); .* stay 'running' until", 10
    )
    assert launcher.wait(30) == 1, launcher.transcript()
    assert counts(dsn).get("running") == 2  # left for heartbeat rescue, as it said


def test_a_def_handler_past_the_drain_timeout_leaves_its_attempt_for_rescue(dsn, launchers):
    # The child logged "stopped", then its exit waited for the handler thread until the
    # launcher's SIGKILL (exit 1). Now it exits within its drain bound (exit 0), saying what it
    # leaves 'running' for heartbeat rescue.
    import awa_fast as awa

    with awa.Client(dsn) as c:
        job = c.insert(DefNap(30_000), queue=QUEUE)
    launcher = Launcher(dsn, "--processes", "1", "--queues", f"{QUEUE}:2", "--drain-timeout", "1")
    launchers.append(launcher)
    launcher.ready_pids(1)

    def state() -> str:
        with psycopg.connect(dsn) as conn:
            row = conn.execute(
                "SELECT state::text FROM awa_fast.jobs_all WHERE id = %s", (job.id,)
            ).fetchone()
        return row[0]

    poll(lambda: state() == "running", 30, "the def handler running")
    t0 = time.monotonic()
    launcher.proc.send_signal(signal.SIGTERM)
    assert launcher.wait(30) == 0, launcher.transcript()
    assert time.monotonic() - t0 < kill_after_s(1), launcher.transcript()
    launcher.wait_line(r"child 0 pid \d+ exited with code 0", 5)
    launcher.wait_line(r"all children stopped", 5)
    transcript = launcher.transcript()
    assert "def handler thread(s) still running after the drain" in transcript, transcript
    assert f"job ids {job.id}" in transcript, transcript
    assert "given back to available" not in transcript, transcript  # its thread keeps it
    assert state() == "running"  # its thread died with the child: heartbeat rescue takes it


def test_sigkilled_child_is_restarted_and_its_jobs_rescued(dsn, launchers):
    total = 60
    enqueue(dsn, total, 1500)
    launcher = Launcher(dsn, "--processes", "2", "--queues", f"{QUEUE}:5")
    launchers.append(launcher)
    pids = launcher.ready_pids(2)
    poll(lambda: counts(dsn).get("running", 0) >= 10, 30, "both children busy")
    victim = pids[0]
    os.kill(victim, signal.SIGKILL)
    launcher.wait_line(rf"child 0 pid {victim} exited with code -9; restarting", 10)
    m = launcher.wait_line(r"child 0 pid (\d+) ready", 30)
    assert int(m.group(1)) != victim
    poll(lambda: counts(dsn) == {"completed": total}, 90, f"all {total} completed")
    with psycopg.connect(dsn) as conn:
        rescued = conn.execute(
            "SELECT count(*) FROM awa_fast.jobs_all WHERE attempt > 1"
        ).fetchone()[0]
    assert rescued >= 1  # the killed child's in-flight jobs were rescued and ran again
    launcher.proc.send_signal(signal.SIGTERM)
    assert launcher.wait(60) == 0


def test_exactly_one_leader_and_failover(dsn, launchers):
    launcher = Launcher(dsn, "--processes", "3", "--queues", f"{QUEUE}:2")
    launchers.append(launcher)
    pids = launcher.ready_pids(3)
    # The leader line may have come before every child was ready (already consumed).
    pattern = r"child (\d+) pid (\d+) became maintenance leader"
    m = next(
        (m for m in map(re.compile(pattern).search, launcher.seen) if m), None
    ) or launcher.wait_line(pattern, 20)
    leader_index, leader_pid = int(m.group(1)), int(m.group(2))
    assert pids[leader_index] == leader_pid
    holders = poll(lambda: leader_backends(dsn), 10, "a leader lock holder")
    assert len(holders) == 1
    # stays exactly one over several election intervals (200 ms each)
    for _ in range(10):
        assert len(leader_backends(dsn)) == 1
        time.sleep(0.1)
    old_backend = holders[0]

    mark = len(launcher.seen)
    os.kill(leader_pid, signal.SIGKILL)

    def line(pat, timeout):  # lines may arrive in any order after the kill
        found = next((m for m in map(re.compile(pat).search, launcher.seen[mark:]) if m), None)
        return found or launcher.wait_line(pat, timeout)

    line(rf"child {leader_index} pid {leader_pid} exited with code -9", 10)
    m = line(r"child (\d+) pid (\d+) became maintenance leader", 20)
    assert int(m.group(2)) != leader_pid
    new = poll(lambda: [h for h in leader_backends(dsn) if h != old_backend], 10, "new leader")
    assert len(new) == 1 and len(leader_backends(dsn)) == 1
    line(rf"child {leader_index} pid \d+ ready", 30)  # the restarted child
    for _ in range(10):
        assert len(leader_backends(dsn)) == 1
        time.sleep(0.1)
    launcher.proc.send_signal(signal.SIGTERM)
    assert launcher.wait(60) == 0


def test_children_that_keep_dying_make_the_launcher_give_up(dsn, launchers):
    t0 = time.monotonic()
    launcher = Launcher(dsn, "--processes", "1", fail="start")
    launchers.append(launcher)
    launcher.wait_line(r"child 0 pid \d+ exited with code 1; restarting in 0.5 s", 30)
    assert launcher.wait(90) == 1
    assert time.monotonic() - t0 < 90
    launcher.wait_line(r"child 0 died 6 times within 60 s; giving up", 5)


def _check(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "awa_fast", "check", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def _worker(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "awa_fast", "worker", *args, "--processes", "2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


@pytest.mark.parametrize(
    "spec, message",
    [
        (
            "tests.no_such_module:client",
            "cannot import module 'tests.no_such_module': No module "
            f"named 'tests.no_such_module' (searched the current "
            f"directory {ROOT}, then sys.path)",
        ),
        ("tests.launcher_app:nope", "module 'tests.launcher_app' has no attribute 'nope'"),
        ("tests.launcher_app:Nap", "tests.launcher_app:Nap is a type, not an awa_fast AsyncClient"),
    ],
)
def test_bad_application_spec_is_a_usage_error_reported_once(spec, message):
    r = _worker(spec)
    assert r.returncode == 2, (spec, r.stdout, r.stderr)
    assert r.stderr == f"awa-fast worker: error: {message}\n"
    assert r.stdout == ""  # no child was started


def test_failing_application_import_is_reported_once(dsn):
    # one line: what failed, the application's line that raised it, how to see the traceback
    env = {**os.environ, "AWA_FAST_LAUNCHER_FAIL": "import", "AWA_FAST_LAUNCHER_DSN": dsn}
    r = _worker("tests.launcher_app:client", env=env)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert re.fullmatch(
        r"awa-fast worker: error: importing tests.launcher_app:client failed: RuntimeError: "
        r"launcher_app: failing at import on purpose \(at .*/tests/launcher_app\.py:\d+\); run "
        r"with --traceback \(or AWA_FAST_DEBUG=1\) for the whole traceback\n",
        r.stderr,
    ), r.stderr
    assert r.stdout == ""


def test_start_options_start_would_reject_are_reported_before_any_child(dsn):
    env = {**os.environ, "AWA_FAST_LAUNCHER_FAIL": "config", "AWA_FAST_LAUNCHER_DSN": dsn}
    r = _worker("tests.launcher_app:client", env=env)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert r.stderr.startswith(
        "awa-fast worker: error: tests.launcher_app:client: start() would "
        "reject this configuration: heartbeat_interval_ms"
    ), r.stderr
    assert r.stdout == ""  # no child was started
    # `awa-fast check` reports the same configuration error with the same exit status
    c = _check("tests.launcher_app:client", env=env)
    assert (
        c.returncode == 1
        and "start() would reject this configuration: heartbeat_interval_ms" in c.stdout
    ), (c.stdout, c.stderr)


def test_start_options_giving_queues_is_a_config_error_pointing_at_dash_dash_queues(dsn):
    # start(queues, **START_OPTIONS) raised "got multiple values for argument 'queues'"
    env = {**os.environ, "AWA_FAST_LAUNCHER_FAIL": "queues", "AWA_FAST_LAUNCHER_DSN": dsn}
    r = _worker("tests.launcher_app:client", env=env)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert r.stderr.startswith(
        "awa-fast worker: error: tests.launcher_app:client: start() would "
        "reject this configuration: queues: START_OPTIONS may not give queues"
    ), r.stderr
    assert "--queues" in r.stderr and "multiple values" not in r.stderr
    assert r.stdout == ""  # no child was started
    c = _check("tests.launcher_app:client", env=env)
    assert c.returncode == 1 and (
        "start() would reject this configuration: queues: START_OPTIONS may not give queues"
        in c.stdout
    ), (c.stdout, c.stderr)


def test_a_module_running_its_program_at_import_fails_the_preflight(dsn, tmp_path):
    # the README example without its __main__ guard: a plain import works, but in a worker
    # (inside a running event loop) asyncio.run raises
    (tmp_path / "unguarded.py").write_text(
        "import asyncio\nimport awa_fast as awa\n"
        f"client = awa.AsyncClient({dsn!r})\n"
        "async def main():\n    pass\n"
        "asyncio.run(main())\n"
    )
    r = subprocess.run(
        [sys.executable, "-m", "awa_fast", "worker", "unguarded:client", "--processes", "2"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert r.stderr.startswith("awa-fast worker: error: importing unguarded:client failed: ")
    assert "asyncio.run() cannot be called from a running event loop" in r.stderr
    assert "Traceback" not in r.stderr
    assert 'Put it under `if __name__ == "__main__":`' in r.stderr
    assert r.stdout == ""  # no child was started


def test_a_child_whose_import_raises_is_fatal_at_once(dsn, launchers):
    launcher = Launcher(dsn, "--processes", "1", fail="child-import")
    launchers.append(launcher)
    assert launcher.wait(60) == 1, launcher.transcript()
    out = launcher.transcript()
    assert re.search(r"child 0 pid \d+ exited with code 76\n", out), out
    assert re.search(
        r"child 0 pid \d+: importing tests.launcher_app:client failed: "
        r"RuntimeError: launcher_app: failing at import on purpose \(at [^)]*\); "
        r"run with --traceback \(or AWA_FAST_DEBUG=1\) for the whole traceback; giving up",
        out,
    )
    assert "restarting" not in out and out.count(" started\n") == 1, out
    # once, by the launcher: the child reported it and did not log it again
    assert out.count("failing at import on purpose") == 1, out
    assert "Traceback" not in out, out


# A SIGINT at the first import orjson's extension init makes (sent by an import hook, so it
# lands there every time): orjson does not check those imports and dereferenced NULL.
_SIGINT_INSIDE_ORJSON_INIT = """
import os, signal, sys

class InterruptInsideOrjsonInit:
    fired = False

    def find_spec(self, name, path=None, target=None):
        # orjson's package is in sys.modules without its names while its extension initializes
        package = sys.modules.get("orjson")
        if not self.fired and package is not None and not hasattr(package, "dumps"):
            if name != "orjson.orjson":
                self.fired = True
                os.kill(os.getpid(), signal.SIGINT)
        return None

hook = InterruptInsideOrjsonInit()
sys.meta_path.insert(0, hook)
try:
    import awa_fast
except KeyboardInterrupt:
    print("interrupted" if hook.fired else "interrupted elsewhere")
    raise SystemExit(130)
print("imported without an interrupt")
"""


def test_ctrl_c_while_awa_fast_imports_orjson_is_a_keyboard_interrupt_not_a_crash():
    # `awa-fast worker` segfaulted (exit -11) when Ctrl-C came about 50 ms after it started.
    r = subprocess.run(
        [sys.executable, "-c", _SIGINT_INSIDE_ORJSON_INIT],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=sigint_as_at_a_terminal,
    )
    assert (r.returncode, r.stdout.strip()) == (130, "interrupted"), r.stderr[-2000:]


def test_a_url_from_the_environment_reaches_the_children_outside_their_argv(dsn, launchers):
    # it was passed as --database-url, so `ps` showed any local user the password
    from psycopg.conninfo import make_conninfo

    url = make_conninfo(dsn, password="s3cret-in-the-url")  # trust auth ignores it
    launcher = Launcher("", "--processes", "1", env={"DATABASE_URL": url})
    launchers.append(launcher)
    (pid,) = launcher.ready_pids(1).values()
    # (the environment, unlike the argv, is readable by the same user only: /proc/<pid>/environ)
    with open(f"/proc/{pid}/cmdline", "rb") as fh:
        assert b"s3cret-in-the-url" not in fh.read()
    enqueue(dsn, 1, 0)
    poll(lambda: counts(dsn).get("completed", 0) == 1, 30, "the job ran on that database")
    launcher.proc.send_signal(signal.SIGTERM)
    assert launcher.wait(60) == 0, launcher.transcript()


def closed_port_url() -> str:
    """A database URL on a local port nothing listens on (connecting fails at once)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"postgresql://awa@127.0.0.1:{port}/nowhere"


def test_database_url_overrides_an_unreachable_url_the_client_was_built_with(dsn, launchers):
    # the client connected at construction, in the preflight: a traceback, "could not connect
    # to the database (the URL given to the client)", although --database-url named a good one
    launcher = Launcher(closed_port_url(), "--processes", "1", global_args=("--database-url", dsn))
    launchers.append(launcher)
    launcher.ready_pids(1)
    enqueue(dsn, 1, 0)
    poll(lambda: counts(dsn).get("completed", 0) == 1, 30, "the job ran on --database-url")
    launcher.proc.send_signal(signal.SIGTERM)
    assert launcher.wait(60) == 0, launcher.transcript()
    assert "Traceback" not in launcher.transcript()


def test_an_unreachable_url_of_the_client_fails_the_children_in_one_line(launchers):
    launcher = Launcher(closed_port_url(), "--processes", "1")
    launchers.append(launcher)
    assert launcher.wait(90) == 1, launcher.transcript()
    out = launcher.transcript()
    assert "cannot reach the database at 127.0.0.1:" in out, out
    assert "Traceback" not in out, out


def test_queue_mismatch_warning_is_shown_once_by_the_launcher(dsn, launchers, tmp_path):
    # in-process start([("emails", 5)]) warns; under the launcher (--queues sets queue_subset)
    # nothing was printed
    (tmp_path / "mismatch_app.py").write_text(
        "import dataclasses\nimport awa_fast as awa\n"
        f"client = awa.AsyncClient({dsn!r})\n"
        "@dataclasses.dataclass\nclass SendEmail:\n    to: str\n"
        "@client.task(SendEmail, failure_consequence=awa.NO_FAILURE_CONSEQUENCE)\n"
        "async def send(job):\n    pass\n"
    )
    launcher = Launcher(
        dsn,
        "--processes",
        "2",
        "--queues",
        "emails:5",
        app="mismatch_app:client",
        env={"PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])},
    )
    launchers.append(launcher)
    launcher.ready_pids(2)
    launcher.proc.send_signal(signal.SIGTERM)
    assert launcher.wait(60) == 0, launcher.transcript()
    time.sleep(0.5)  # the stderr pump reads to the end
    err = launcher.drain_stderr()
    assert (
        err.count(
            "awa-fast worker: warning: QueueMismatchWarning: start() serves emails but not "
            "'default'"
        )
        == 1
    ), launcher.transcript()
    assert err.count("QueueMismatchWarning") == 1, err


def test_processes_the_application_starts_do_not_get_the_childs_url(dsn, launchers, tmp_path):
    probe = tmp_path / "seen"
    launcher = Launcher(
        "",
        "--processes",
        "1",
        fail="spawn-at-import",
        env={"DATABASE_URL": dsn, "AWA_FAST_LAUNCHER_PROBE": str(probe)},
    )
    launchers.append(launcher)
    launcher.ready_pids(1)
    assert probe.read_text().strip() == "None"
    launcher.proc.send_signal(signal.SIGTERM)
    assert launcher.wait(60) == 0, launcher.transcript()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_stop_while_a_child_still_imports_is_a_clean_drain(dsn, launchers, sig):
    # SIGTERM: the child died of it (-15) and the launcher exited 1; SIGHUP killed the launcher
    launcher = Launcher(dsn, "--processes", "1", fail="slow-child-import")
    launchers.append(launcher)
    launcher.wait_line(r"child 0 pid \d+ started", 30)
    launcher.proc.send_signal(sig)
    assert launcher.wait(60) == 0, launcher.transcript()
    launcher.wait_line(r"child 0 pid \d+ exited with code 0", 5)
    launcher.wait_line(r"all children stopped", 5)


@pytest.mark.parametrize("fail", ["stdout", "hostile-stdout"])
def test_an_application_writing_to_stdout_does_not_break_the_preflight(dsn, launchers, fail):
    launcher = Launcher(dsn, "--processes", "1", fail=fail)
    launchers.append(launcher)
    launcher.ready_pids(1)
    launcher.proc.send_signal(signal.SIGTERM)
    assert launcher.wait(60) == 0, launcher.transcript()


def test_an_application_exiting_at_import_is_reported(dsn, launchers):
    launcher = Launcher(dsn, "--processes", "1", fail="exit")
    launchers.append(launcher)
    assert launcher.wait(60) == 1, launcher.transcript()
    out = launcher.transcript()
    assert "called sys.exit(0)" in out and "Traceback" not in out, out


def test_a_role_that_cannot_write_is_a_configuration_error_not_a_crash_loop(dsn, launchers):
    from psycopg.conninfo import make_conninfo

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP ROLE IF EXISTS awa_launch_reader")
        conn.execute("CREATE ROLE awa_launch_reader LOGIN")
        conn.execute("GRANT USAGE ON SCHEMA awa_fast TO awa_launch_reader")
        conn.execute("GRANT SELECT ON ALL TABLES IN SCHEMA awa_fast TO awa_launch_reader")
    try:
        launcher = Launcher(make_conninfo(dsn, user="awa_launch_reader"), "--processes", "1")
        launchers.append(launcher)
        assert launcher.wait(60) == 1, launcher.transcript()
        out = launcher.transcript()
        assert "cannot start: the database refused it: permission denied" in out, out
        assert "died" not in out and "restart" not in out, out  # given up at once
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("DROP OWNED BY awa_launch_reader")
            conn.execute("DROP ROLE awa_launch_reader")


def test_a_drain_timeout_that_is_not_finite_is_rejected_at_once():
    # `--drain-timeout inf` was accepted; at SIGTERM the child died of an OverflowError
    r = subprocess.run(
        [sys.executable, "-m", "awa_fast", "worker", "tests.launcher_app:client"]
        + ["--drain-timeout", "inf"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "must be a finite number > 0, got inf" in r.stderr, r.stderr


@pytest.mark.parametrize("drain_timeout", [0, 1, 30])
def test_the_launchers_kill_deadline_covers_the_childs_own_drain_bounds(drain_timeout):
    # KILL_GRACE_S (10 s after the drain timeout) was shorter than the child's own bounds after
    # it (the finalizer's last flush alone may take 10 s, the cancel of its tasks 11 s more):
    # a child within its bounds was killed mid-flush and its completions were lost to rescue.
    from awa_fast.client import RELEASE_WAIT_S
    from awa_fast.worker import presence, shutdown

    after_timeout = kill_after_s(drain_timeout) - drain_timeout
    bounded = (
        shutdown.SHUTDOWN_GRACE_S  # the finalizer's last flush
        + shutdown.SHUTDOWN_GRACE_S  # the attempts left after the drain
        + presence.PRESENCE_GONE_S
    )
    assert after_timeout > bounded
    assert kill_after_s(drain_timeout) >= shutdown.shutdown_bound_s(drain_timeout)
    assert kill_after_s(drain_timeout) - shutdown.shutdown_bound_s(drain_timeout) >= 5  # close()
    assert RELEASE_WAIT_S <= kill_after_s(0)
