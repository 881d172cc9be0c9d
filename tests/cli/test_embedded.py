"""Tests of the embedded PostgreSQL launcher (awa_fast.embedded) and the conftest fixtures."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
import pytest

from awa_fast import embedded
from awa_fast.embedded import (
    EmbeddedPostgresError,
    cluster,
    ensure_running,
    start_temp,
    stop_persistent,
)

REPO = Path(__file__).resolve().parents[2]

# These tests start embedded servers of their own (no database fixture): integration tests.
pytestmark = pytest.mark.integration


def _version(dsn: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute("select version()").fetchone()[0]


def _wait_pid_gone(pid: int, timeout: float) -> bool:
    """Wait (without busy sleeping where possible) until *pid* has exited; True if it did."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    except (AttributeError, OSError):
        fd = None
    if fd is not None:
        try:
            p = select.poll()
            p.register(fd, select.POLLIN)
            return bool(p.poll(timeout * 1000))  # readable once the process has exited
        finally:
            os.close(fd)
    deadline = time.monotonic() + timeout  # fallback without pidfd: bounded poll
    while time.monotonic() < deadline:
        if not cluster._pid_alive(pid):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.slow
def test_start_temp_connects_and_stop_removes_dir():
    server = start_temp()
    try:
        assert server.running
        assert server.datadir.name.startswith(f"awa-pg-t{os.getpid()}-")
        assert server.dsn == f"postgresql://postgres@127.0.0.1:{server.port}/postgres"
        version = _version(server.dsn)
        if not os.environ.get("AWA_PG_BINDIR"):
            assert "PostgreSQL 18" in version
        with psycopg.connect(server.socket_dsn, autocommit=True) as conn:  # unix socket too
            assert conn.execute("show fsync").fetchone()[0] == "off"
            assert conn.execute("show max_connections").fetchone()[0] == "200"
        if os.geteuid() == 0:
            assert Path(server.datadir).stat().st_uid != 0  # the server does not run as root
    finally:
        server.stop()
    assert not server.running
    assert not server.datadir.exists()
    server.stop()  # idempotent


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_restart_keeps_data_and_drops_connections(mode):
    """The fault tests' server restart: same port and data, every old connection gone; an
    immediate restart runs crash recovery."""
    with start_temp() as server:
        old = psycopg.connect(server.dsn, autocommit=True)
        old.execute("CREATE TABLE kept (n int); INSERT INTO kept VALUES (7)")
        pid = server.pid
        server.restart(mode)
        assert server.pid != pid and server.running
        with pytest.raises(psycopg.OperationalError):
            old.execute("SELECT 1")
        old.close()
        with psycopg.connect(server.dsn) as conn:
            assert conn.execute("SELECT n FROM kept").fetchone() == (7,)
        recovery = (
            "database system was interrupted"
            if mode == "immediate"
            else "database system was shut down"
        )
        assert recovery in server.log_path.read_text()
        with pytest.raises(ValueError, match="restart mode"):
            server.restart("smart")


def test_two_temp_servers_at_once():
    with start_temp() as a, start_temp() as b:
        assert a.port != b.port and a.datadir != b.datadir
        for s in (a, b):
            with psycopg.connect(s.dsn, autocommit=True) as conn:
                conn.execute("create table t (x int)")
                conn.execute("insert into t values (%s)", (s.port,))
        for s in (a, b):
            with psycopg.connect(s.dsn) as conn:
                assert conn.execute("select x from t").fetchall() == [(s.port,)]
    assert not a.datadir.exists() and not b.datadir.exists()


_CHILD = """
import sys, threading
sys.path.insert(0, {repo!r})
from awa_fast.embedded import start_temp
s = start_temp()
print(s.port, s.pid, s.datadir, flush=True)
threading.Event().wait()
"""


@pytest.mark.slow
def test_killed_parent_leaves_no_running_server():
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD.format(repo=str(REPO))],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = child.stdout.readline()
        assert line, "child did not start a server"
        port, pid, datadir = line.split(maxsplit=2)
        port, pid, datadir = int(port), int(pid), Path(datadir.strip())
        assert cluster._pid_alive(pid)
        with psycopg.connect(f"postgresql://postgres@127.0.0.1:{port}/postgres") as conn:
            conn.execute("select 1")
    finally:
        child.kill()
        child.wait()
    assert _wait_pid_gone(pid, timeout=30), f"postmaster {pid} survived the SIGKILL of its parent"
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(f"postgresql://postgres@127.0.0.1:{port}/postgres", connect_timeout=2)
    assert "database system is shut down" in (datadir / "server.log").read_text()
    # the killed run's directory is left behind and removed by the next start_temp()
    assert datadir.exists()
    with start_temp():
        assert not datadir.exists()


@pytest.fixture
def persistent_data_dir(monkeypatch):
    parent = Path(tempfile.mkdtemp(prefix="awa-pg-e", dir="/tmp"))
    os.chmod(parent, 0o755)  # the server account must be able to enter it when we are root
    datadir = parent / "pg"
    monkeypatch.setenv("AWA_PG_DATA", str(datadir))
    yield datadir
    try:
        stop_persistent()
    finally:
        import shutil

        shutil.rmtree(parent, ignore_errors=True)


@pytest.mark.slow
def test_ensure_running_and_stop_persistent(persistent_data_dir, capfd):
    datadir = persistent_data_dir
    assert stop_persistent() is False  # nothing there yet

    dsn = ensure_running()
    assert dsn == f"postgresql://postgres@/postgres?host={datadir}&port=5432"
    err = capfd.readouterr()
    assert err.out == ""
    assert err.err.strip().splitlines() == [
        f"awa-fast: started embedded PostgreSQL {(datadir / 'PG_VERSION').read_text().strip()} at {datadir}"
    ]
    if not os.environ.get("AWA_PG_BINDIR"):
        assert "PostgreSQL 18" in _version(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("show listen_addresses").fetchone()[0] == ""
        conn.execute("create table keep (x int)")
    assert oct(datadir.stat().st_mode & 0o777) == "0o700"

    # reused silently
    assert ensure_running() == dsn
    assert capfd.readouterr().err == ""

    # stop, then start again from the existing cluster: data survives
    assert stop_persistent() is True
    assert stop_persistent() is False
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(dsn, connect_timeout=2)
    assert ensure_running() == dsn
    assert "started embedded PostgreSQL" in capfd.readouterr().err
    with psycopg.connect(dsn) as conn:
        assert conn.execute("select count(*) from keep").fetchone()[0] == 0


def test_ensure_running_refuses_long_socket_path(monkeypatch):
    long = "/tmp/" + "x" * 90 + "/pg"
    monkeypatch.setenv("AWA_PG_DATA", long)
    with pytest.raises(EmbeddedPostgresError, match="AWA_PG_DATA"):
        ensure_running()
    assert not Path(long).exists()


def test_find_bindir_respects_env(monkeypatch, tmp_path):
    monkeypatch.setenv("AWA_PG_BINDIR", str(tmp_path))
    with pytest.raises(EmbeddedPostgresError, match="AWA_PG_BINDIR"):
        embedded.find_bindir()
    (tmp_path / "postgres").touch()
    assert embedded.find_bindir() == tmp_path.resolve()


def test_find_bindir_default_is_usable(monkeypatch):
    monkeypatch.delenv("AWA_PG_BINDIR", raising=False)
    bindir = embedded.find_bindir()
    for tool in ("initdb", "pg_ctl", "postgres"):
        assert os.access(bindir / tool, os.X_OK)
    if os.geteuid() == 0:
        assert cluster._reachable_by_others(bindir / "postgres")


def test_footprint_names_the_binaries_copy_the_server_runs_from(monkeypatch):
    # the demo's removal advice names this path: the copy find_bindir uses, or None in place
    monkeypatch.delenv("AWA_PG_BINDIR", raising=False)
    bindir = embedded.find_bindir()
    copy = embedded.footprint()["binaries_copy"]
    if copy is None:
        assert bindir == cluster._wheel_paths()[0] / "bin"
    else:
        assert os.geteuid() == 0 and bindir.is_relative_to(copy)
    monkeypatch.setenv("AWA_PG_BINDIR", str(bindir))
    assert embedded.footprint()["binaries_copy"] is None


def test_footprint_names_the_default_data_directorys_parent_only(monkeypatch, tmp_path):
    monkeypatch.delenv("AWA_PG_DATA", raising=False)
    fp = embedded.footprint()
    assert fp["data_dir_parent"] == str(embedded.default_data_dir().parent)
    assert Path(fp["data_dir_parent"]).name == "awa-fast"
    monkeypatch.setenv("AWA_PG_DATA", str(tmp_path / "pg"))
    assert embedded.footprint()["data_dir_parent"] is None


def test_fresh_database_per_module(dsn, pg_base_dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        name = conn.execute("select current_database()").fetchone()[0]
        assert name.startswith("test_embedded_") and len(name) <= 63
        conn.execute("create table only_here (x int)")
    with psycopg.connect(pg_base_dsn, autocommit=True) as conn:
        assert conn.execute("select current_database()").fetchone()[0] != name
        dbs = {r[0] for r in conn.execute("select datname from pg_database")}
        assert name in dbs


@pytest.mark.parametrize("where", ["/proc/1/awa-fast-pg", "/proc/awa-fast/pg"])
def test_ensure_running_names_a_data_directory_it_cannot_create(monkeypatch, where):
    # a read-only file system or a parent that cannot be created: an OSError traceback
    monkeypatch.setenv("AWA_PG_DATA", where)
    with pytest.raises(EmbeddedPostgresError, match="cannot create the embedded server's data"):
        ensure_running()
