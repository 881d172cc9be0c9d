"""``awa-fast demo``: the two-stage import-graph pipeline over the standard library, worked by
two worker processes, with a deliberately broken file that must fail its A job and be counted."""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psycopg
import pytest

from awa_fast.demo import MAX_STAGED, chunk, imported_modules
from tests.support import sigint_as_at_a_terminal

TIMEOUT_S = 300


def _env() -> dict:
    return {
        k: v for k, v in os.environ.items() if k not in ("AWA_FAST_DATABASE_URL", "DATABASE_URL")
    }


def start_demo(dsn: str, *args: str, interrupt: bool = False) -> subprocess.Popen:
    """``awa-fast demo args...`` started against ``dsn``, stdout and stderr piped (text);
    ``interrupt``: SIGINT raises KeyboardInterrupt in it, as at a terminal."""
    return subprocess.Popen(
        [sys.executable, "-m", "awa_fast", "--database-url", dsn, "demo", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
        preexec_fn=sigint_as_at_a_terminal if interrupt else None,
    )


def run_demo(dsn: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "awa_fast", "--database-url", dsn, "demo", *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=_env(),
    )


def unfinished_demo_jobs(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        return conn.execute(
            "SELECT count(*) FROM awa_fast.jobs_all WHERE queue = 'demo' AND state "
            "IN ('available', 'scheduled', 'retryable', 'running')"
        ).fetchone()[0]


def report(stdout: str) -> dict:
    out = {}
    for line in stdout.splitlines():
        parts = re.split(r"\s{2,}", line.strip(), maxsplit=1)
        if len(parts) == 2:
            out[parts[0]] = parts[1]
    return out


def test_imported_modules_and_chunks():
    src = b"import os.path, sys\nfrom a.b import c\nfrom . import x\nfrom .y import z\nimport os\n"
    assert imported_modules(src) == ["a", "os", "sys"]
    names = [f"m{i:02d}" for i in range(40)]
    assert chunk(names[:16], 0) == (names[:16], None)
    assert chunk(names, 0) == (names[:15], 15)
    assert chunk(names, 15) == (names[15:30], 30)
    assert chunk(names, 30) == (names[30:], None)
    assert MAX_STAGED == 16


def test_removal_advice_names_the_binaries_copy_and_never_deletes_a_shared_account():
    from awa_fast.demo import embedded_notice

    base = {"data_dir": "/var/lib/awa-fast/pg18", "os_user": "awa-postgres", "running": False}
    # as root, with an account that already existed (maybe used by something else)
    text = "\n".join(
        embedded_notice(
            {**base, "system_account": True, "creates_user": False, "binaries_copy": None}
        )
    )
    # (binaries run in place: no copy to name)
    assert (
        "to remove it, stop it, then `rm -rf /var/lib/awa-fast/pg18` and, if nothing else uses "
        "that account, `userdel awa-postgres`"
    ) in text
    assert "awa-pg-bin" not in text
    text = "\n".join(
        embedded_notice(
            {
                **base,
                "system_account": True,
                "creates_user": True,
                "binaries_copy": "/tmp/awa-pg-bin-18.1",
            }
        )
    )
    assert "`rm -rf /tmp/awa-pg-bin-18.1` and, if nothing else uses that account" in text
    # as an ordinary user: the data directory only
    text = "\n".join(
        embedded_notice(
            {
                **base,
                "os_user": "me",
                "system_account": False,
                "creates_user": False,
                "binaries_copy": None,
            }
        )
    )
    assert text.endswith("to remove it, stop it, then `rm -rf /var/lib/awa-fast/pg18`")
    assert "userdel" not in text and "awa-pg-bin" not in text
    # the default data directory's parent was made for it: rmdir, which keeps anything else
    text = "\n".join(
        embedded_notice(
            {
                **base,
                "data_dir": "/home/me/.local/share/awa-fast/pg18",
                "data_dir_parent": "/home/me/.local/share/awa-fast",
                "os_user": "me",
                "system_account": False,
                "creates_user": False,
                "binaries_copy": None,
            }
        )
    )
    assert text.endswith(
        "then `rm -rf /home/me/.local/share/awa-fast/pg18`, "
        "`rmdir /home/me/.local/share/awa-fast` if that leaves it empty"
    )


def test_demo_pipeline_with_a_broken_file(dsn, tmp_path):
    broken = tmp_path / "broken_module.py"
    broken.write_text("import os\ndef f(:\n    pass\n")
    many = tmp_path / "many_imports.py"  # 20 distinct modules: one continuation A job
    many.write_text("".join(f"import demo_fake_mod_{i:02d}\n" for i in range(20)) + "import os\n")
    r = run_demo(dsn, "--limit", "60", "--processes", "2", "--extra-path", str(tmp_path))
    assert r.returncode == 0, (r.stdout, r.stderr)
    rep = report(r.stdout)
    assert rep["files processed"].startswith("62 ")
    assert rep["A failed"].startswith("1 ")
    assert "broken_module.py: SyntaxError: " in r.stdout
    assert re.search(r"\(\d+ files \+ 1 continuations", rep["stage A jobs"])
    assert "check: OK" in r.stdout
    assert "demo:" in r.stderr and "worker: child 1 pid" in r.stderr
    distinct = int(rep["distinct modules"])
    assert int(rep["B jobs inserted"]) == distinct
    staged = int(re.search(r"of (\d+) staged", rep["B skipped as dup"]).group(1))
    assert int(rep["B skipped as dup"].split()[0]) == staged - distinct > 0

    with psycopg.connect(dsn) as conn:
        rows = dict(
            conn.execute(
                "SELECT kind || ':' || state::text, count(*) FROM awa_fast.jobs_all "
                "WHERE queue = 'demo' GROUP BY 1"
            ).fetchall()
        )
        names = [
            r[0]
            for r in conn.execute(
                "SELECT args->>'name' FROM awa_fast.jobs_all WHERE kind = 'demo_resolve_module'"
            )
        ]
        fake = conn.execute(
            "SELECT count(*) FROM awa_fast_demo_modules "
            "WHERE name LIKE 'demo_fake_mod_%%' AND NOT found"
        ).fetchone()[0]
    assert rows["demo_parse_imports:failed"] == 1
    assert rows["demo_resolve_module:completed"] == distinct
    assert len(names) == len(set(names)) == distinct  # exactly one B per distinct module
    assert {f"demo_fake_mod_{i:02d}" for i in range(20)} <= set(names)
    assert fake == 20

    # a rerun starts from scratch (JSON report) and gives the same numbers
    r2 = run_demo(dsn, "--limit", "60", "--processes", "1", "--extra-path", str(tmp_path), "--json")
    assert r2.returncode == 0, (r2.stdout, r2.stderr)
    result = json.loads(r2.stdout)
    assert result["check_ok"] is True and result["a_failed"] == 1
    assert result["distinct_modules"] == distinct and result["b_staged"] == staged
    assert result["failures"][0]["path"] == str(broken)


def test_ctrl_c_prints_a_summary_and_removes_the_demos_unfinished_jobs(dsn):
    """A real SIGINT while stage B is held back (a SHARE lock on the results table blocks its
    upserts, so the pipeline cannot finish first)."""
    proc = start_demo(dsn, "--processes", "1", "--limit", "200", interrupt=True)
    seen = []
    try:
        with psycopg.connect(dsn) as lock:
            for line in proc.stderr:
                seen.append(line)
                if "enqueued 200 stage-A jobs" in line:  # the results table exists and is empty
                    lock.execute("LOCK TABLE awa_fast_demo_modules IN SHARE MODE")
                if re.search(r"worker: child 0 pid \d+ ready", line):
                    break
            else:
                raise AssertionError("".join(seen))
            with psycopg.connect(dsn) as conn:  # wait until B is held at the lock
                deadline = time.monotonic() + 60
                while not conn.execute(
                    "SELECT count(*) FROM awa_fast.jobs_all WHERE kind = 'demo_resolve_module' "
                    "AND state = 'running'"
                ).fetchone()[0]:
                    assert time.monotonic() < deadline, "no stage-B job started"
                    time.sleep(0.05)
            proc.send_signal(signal.SIGINT)
            lock.rollback()  # let the held upserts go so that the drain is quick
        out, err = proc.communicate(timeout=TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = "".join(seen) + err
    assert proc.returncode == 130, (out, err)
    assert "demo: 200 .py files, 1 worker process(es), queue 'demo'" in err
    assert (
        "Ctrl-C, SIGTERM or SIGHUP stops it, prints a summary and removes its unfinished jobs"
        in err
    )
    assert "demo: interrupted by SIGINT: stopping the workers" in err
    assert "Traceback" not in err
    lines = out.splitlines()
    assert re.fullmatch(
        r"interrupted by SIGINT after \d+\.\d s \(1 worker process, 200 files\)", lines[0]
    )
    assert re.fullmatch(
        r"stage A: \d+ completed, \d+ failed, \d+ unfinished "
        r"\(\d+ jobs: 200 files \+ \d+ continuations\)",
        lines[1],
    )
    removed = int(
        re.fullmatch(
            r"removed (\d+) unfinished demo job\(s\) from queue 'demo'; "
            r"finished rows stay until the next `awa-fast demo` deletes them",
            lines[3],
        ).group(1)
    )
    assert removed > 0
    assert unfinished_demo_jobs(dsn) == 0


@pytest.mark.parametrize("sigterm_in_drain", [False, True], ids=["timeout", "then_sigterm"])
def test_the_timeout_stops_the_demo_and_removes_its_unfinished_jobs(dsn, sigterm_in_drain):
    """Past --timeout the demo stops as after an interrupt (drain, count, remove what did not
    finish) and exits 1; stage B is held back by a SHARE lock so it cannot finish first. A
    SIGTERM during that drain waits for it (it started a second drain; breaker helper)."""
    proc = start_demo(dsn, "--processes", "1", "--limit", "200", "--timeout", "3")
    seen = []
    try:
        with psycopg.connect(dsn) as lock:
            for line in proc.stderr:
                seen.append(line)
                if "enqueued 200 stage-A jobs" in line:  # the results table exists and is empty
                    lock.execute("LOCK TABLE awa_fast_demo_modules IN SHARE MODE")
                if "demo: timed out after 3 s" in line:
                    break
            else:
                raise AssertionError("".join(seen))
            if sigterm_in_drain:  # its drain waits for the held upserts: the signal lands in it
                proc.send_signal(signal.SIGTERM)
            lock.rollback()  # let the held upserts go so that the drain is quick
        out, err = proc.communicate(timeout=TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = "".join(seen) + err
    assert "Traceback" not in err
    lines = out.splitlines()
    if sigterm_in_drain:
        assert proc.returncode == 143, (out, err)
        assert err.count("draining 1 child(ren)") == 1, err
        assert lines[0].startswith("interrupted by SIGTERM after"), out
        assert unfinished_demo_jobs(dsn) == 0
        return
    assert proc.returncode == 1, (out, err)
    assert re.fullmatch(r"timed out after \d+\.\d s \(1 worker process, 200 files\)", lines[0])
    assert re.fullmatch(
        r"removed (\d+) unfinished demo job\(s\) from queue 'demo'; "
        r"finished rows stay until the next `awa-fast demo` deletes them",
        lines[3],
    )
    assert unfinished_demo_jobs(dsn) == 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_stop_signal_stops_the_demo_as_ctrl_c_does_and_counts_its_continuations(
    dsn, tmp_path, sig
):
    """SIGTERM (a service manager, `kill`) or SIGHUP (a closed terminal) while stage B is held
    back (a SHARE lock on the results table blocks its upserts) and a continuation A job exists:
    the same clean stop as Ctrl-C (the drain lets the in-flight continuation finish), exit 128 +
    the signal, the continuation counted and every unfinished job gone."""
    many = tmp_path / "many_imports.py"  # 20 distinct modules: 15 staged + one continuation
    many.write_text("".join(f"import demo_fake_mod_{i:02d}\n" for i in range(20)))
    proc = start_demo(dsn, "--processes", "1", "--limit", "1", "--extra-path", str(many))
    seen = []
    try:
        with psycopg.connect(dsn) as lock:
            for line in proc.stderr:
                seen.append(line)
                if "enqueued 2 stage-A jobs" in line:  # the results table exists and is empty
                    lock.execute("LOCK TABLE awa_fast_demo_modules IN SHARE MODE")
                # Both files parsed: the continuation was inserted with the many-imports file's
                # completion. (It cannot complete: the held Bs hold the worker's connections.)
                if re.search(r"s: A [23] completed, 0 failed; B 0/\d+ completed", line):
                    break
            else:
                raise AssertionError("".join(seen))
            proc.send_signal(sig)
            lock.rollback()  # let the held upserts go so that the drain is quick
        out, err = proc.communicate(timeout=TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = "".join(seen) + err
    assert proc.returncode == 128 + sig, (out, err)
    assert f"demo: interrupted by {sig.name}: stopping the workers" in err
    assert "Traceback" not in err
    lines = out.splitlines()
    assert re.fullmatch(
        rf"interrupted by {sig.name} after \d+\.\d s \(1 worker process, 2 files\)", lines[0]
    ), lines
    assert (
        lines[1]
        == "stage A: 3 completed, 0 failed, 0 unfinished (3 jobs: 2 files + 1 continuations)"
    )
    b_done, b_all = map(
        int, re.fullmatch(r"stage B: (\d+) completed of (\d+) staged so far", lines[2]).groups()
    )
    removed = int(
        re.fullmatch(
            r"removed (\d+) unfinished demo job\(s\) from queue 'demo'; "
            r"finished rows stay until the next `awa-fast demo` deletes them",
            lines[3],
        ).group(1)
    )
    assert b_all >= 20 and removed == b_all - b_done  # every unfinished B, and only those
    with psycopg.connect(dsn) as conn:
        left = dict(
            conn.execute(
                "SELECT kind || ':' || state::text, count(*) FROM awa_fast.jobs_all "
                "WHERE queue = 'demo' GROUP BY 1"
            ).fetchall()
        )
    assert left == {
        k: n
        for k, n in {
            "demo_parse_imports:completed": 3,
            "demo_resolve_module:completed": b_done,
        }.items()
        if n
    }


@pytest.mark.slow
@pytest.mark.integration  # starts the embedded server itself
def test_demo_on_the_embedded_server_says_what_it_does_first():
    parent = Path(tempfile.mkdtemp(prefix="awa-pg-demo", dir="/tmp"))
    os.chmod(parent, 0o755)  # the server account must be able to enter it when we are root
    datadir = parent / "pg"
    env = {**_env(), "AWA_PG_DATA": str(datadir)}
    try:
        r = subprocess.run(
            [sys.executable, "-m", "awa_fast", "demo", "--limit", "5", "--processes", "1"],
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            env=env,
        )
        assert r.returncode == 0, (r.stdout, r.stderr)
        err = r.stderr
        notice = err.index(
            "demo: no database configured (--database-url, AWA_FAST_DATABASE_URL, DATABASE_URL):"
        )
        started = err.index(f"awa-fast: started embedded PostgreSQL 18 at {datadir}")
        assert notice < started  # said before it happens
        assert f"demo:   starting the embedded PostgreSQL 18 in {datadir}, as " in err
        assert (
            f"demo:   it keeps running after the demo: `awa-fast embedded stop` stops it; "
            f"to remove it, stop it, then `rm -rf {datadir}`"
        ) in err
        if os.geteuid() == 0:
            assert "as the system account 'awa-postgres'" in err
            assert "if nothing else uses that account, `userdel awa-postgres`" in err
        assert "check: OK" in r.stdout
    finally:
        subprocess.run(
            [sys.executable, "-m", "awa_fast", "embedded", "stop"],
            env=env,
            capture_output=True,
            timeout=TIMEOUT_S,
        )
        shutil.rmtree(parent, ignore_errors=True)


@pytest.mark.parametrize(
    "sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["SIGINT", "SIGTERM", "SIGHUP"]
)
def test_a_stop_during_the_first_migration_waits_for_it_and_stops_cleanly(fresh_db, sig):
    """Interrupted while it migrates a fresh database (the test holds the migration lock, so
    the signal arrives while the migration thread waits on it): the demo waits for the
    migration under way to end, then stops with 128 + the signal and a summary saying nothing
    was enqueued; no error, the schema whole and no demo job in it. (It queried the missing
    jobs table while the thread still migrated: `relation "awa_fast.jobs_all" does not
    exist`, exit 1.)"""
    from awa_fast.schema import MIGRATE_LOCK_KEY, current_migration_version

    seen = []
    proc = None
    try:
        with psycopg.connect(fresh_db) as lock:
            lock.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATE_LOCK_KEY,))
            proc = start_demo(fresh_db, "--processes", "1", "--limit", "5", interrupt=True)
            # stderr lines, read by a thread so that every wait is bounded (unfixed, the demo
            # hung on the held migration without printing its error)
            stderr = proc.stderr
            lines: queue.Queue = queue.Queue()
            reader = threading.Thread(target=lambda: [lines.put(x) for x in stderr], daemon=True)
            reader.start()

            def wait_for(text: str) -> None:
                deadline = time.monotonic() + 60
                while True:
                    try:
                        seen.append(lines.get(timeout=max(0.0, deadline - time.monotonic())))
                    except queue.Empty:
                        raise AssertionError(f"no {text!r} line: {''.join(seen)}") from None
                    if text in seen[-1]:
                        return

            wait_for("demo: migrating the awa_fast schema")
            proc.send_signal(sig)
            # the migration is still held at the lock: the demo must wait for it
            wait_for(f"demo: interrupted by {sig.name}")
            wait_for("demo: waiting for the schema migration under way to end")
            lock.rollback()  # the migration goes on
        out = proc.stdout.read()  # to its end: the demo exited
        proc.wait(timeout=TIMEOUT_S)
        reader.join(timeout=TIMEOUT_S)
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
    while not lines.empty():
        seen.append(lines.get())
    err = "".join(seen)
    assert proc.returncode == 128 + sig, (out, err)
    assert "error" not in err.lower() and "Traceback" not in err, err
    summary = out.splitlines()
    assert re.fullmatch(
        rf"interrupted by {sig.name} after \d+\.\d s \(1 worker process, 5 files\)", summary[0]
    ), summary
    assert summary[1].startswith("nothing was enqueued yet"), summary
    with psycopg.connect(fresh_db) as conn:
        version = conn.execute("SELECT max(version) FROM awa_fast.schema_version").fetchone()
        jobs = conn.execute("SELECT count(*) FROM awa_fast.jobs_all").fetchone()[0]
    assert version == (current_migration_version(),)
    assert jobs == 0


def _children(pid: int) -> dict[int, str]:
    """{pid: command line} of the live (not zombie) child processes of ``pid``, from /proc."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if int(ppid) == pid and state != "Z":
            out[int(entry)] = cmdline
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_stop_signal_during_the_check_ends_the_check_processes_too(dsn):
    """SIGTERM to the demo alone (not its process group) while it re-parses the files in its
    check's process pool: exit 143, and no child of the demo (the pool's spawned workers,
    multiprocessing's resource tracker) survives it. (The default action ended the demo alone
    and left them to init for minutes.)"""
    proc = start_demo(dsn, "--processes", "1", "--limit", "1500")
    seen = []
    children: dict[int, str] = {}
    try:
        for line in proc.stderr:
            seen.append(line)
            if "demo: pipeline done in" in line:
                break
        else:
            raise AssertionError("".join(seen))
        deadline = time.monotonic() + 60
        while not any("spawn_main" in c for c in children.values()):
            assert time.monotonic() < deadline, ("no check worker", children)
            children = _children(proc.pid)
            time.sleep(0.02)
        assert proc.poll() is None, "the check ended before the signal: use more files"
        proc.send_signal(signal.SIGTERM)
        # (not communicate(): an orphan holds the pipes open)
        status = proc.wait(timeout=TIMEOUT_S)
        deadline = time.monotonic() + 10
        while (left := [p for p in children if _alive(p)]) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in children:  # unfixed: the orphans this test made
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
    out, err = proc.communicate(timeout=TIMEOUT_S)
    err = "".join(seen) + err
    assert status == 128 + signal.SIGTERM, (out, err)
    assert not left, ("outlived the demo", children, left)
    assert "demo: interrupted by SIGTERM during the check" in err
    assert "Traceback" not in err
