"""Throwaway servers for tests and benchmarks: :func:`start_temp` (see :mod:`awa_fast.embedded`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import urllib.parse
import weakref
from pathlib import Path

from awa_fast.embedded.cluster import (
    _TEMP_PREFIX,
    MAX_SOCKET_PATH,
    START_TIMEOUT,
    EmbeddedPostgresError,
    _Account,
    _check_traversable,
    _free_port,
    _initdb,
    _log_tail,
    _make_pdeathsig_preexec,
    _remove_stale_temp_dirs,
    _run_tool,
    _server_account,
    _server_env,
    _shutdown,
    _stop_proc,
    _stop_signal,
    find_bindir,
)


class TempServer:
    """A throwaway PostgreSQL started by :func:`start_temp`; stop it with :meth:`stop`.

    Attributes:
        dsn: ``postgresql://postgres@127.0.0.1:<port>/postgres`` (trust auth, superuser).
        port: the TCP port on 127.0.0.1 (the unix socket in :attr:`datadir` uses it too).
        datadir: the cluster directory ``/tmp/awa-pg-t<pid>-XXXX`` (also the socket directory);
            removed by :meth:`stop`.
        pid: the postmaster's process id (a direct child of this process).
        log_path: the server log (``<datadir>/server.log``).

    Usable as a context manager; a server never stopped is stopped at interpreter exit, and
    shuts itself down if this process dies (``PR_SET_PDEATHSIG``).
    """

    def __init__(self, proc: subprocess.Popen, port: int, datadir: Path):
        self.port = port
        self.datadir = datadir
        self.log_path = datadir / "server.log"
        self.dsn = f"postgresql://postgres@127.0.0.1:{port}/postgres"
        self._adopt(proc)

    def _adopt(self, proc: subprocess.Popen) -> None:
        self._proc = proc
        self.pid = proc.pid
        self._finalizer = weakref.finalize(self, _shutdown, proc, str(self.datadir))

    @property
    def socket_dsn(self) -> str:
        """A DSN that connects through the unix socket in :attr:`datadir`."""
        host = urllib.parse.quote(str(self.datadir), safe="/")
        return f"postgresql://postgres@/postgres?host={host}&port={self.port}"

    @property
    def running(self) -> bool:
        return self._proc.poll() is None

    def stop(self) -> None:
        """Fast shutdown (SIGINT), wait for the postmaster to exit (up to 30 s, then SIGQUIT/SIGKILL),
        and remove the data directory. Safe to call more than once."""
        self._finalizer()

    def halt(self, mode: str = "fast") -> None:
        """Stop the postmaster as :meth:`restart` does and wait for it to exit, keeping the data
        directory: the server stays down until :meth:`restart` (or :meth:`stop`). For fault
        tests that need the server down for a while.

        Raises:
            ValueError: *mode* is not ``"fast"`` or ``"immediate"``.
        """
        sig = _stop_signal(mode)
        if self._proc.poll() is None:
            self._proc.send_signal(sig)
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()

    def restart(self, mode: str = "fast", *, timeout: float = START_TIMEOUT) -> None:
        """Stop the postmaster (unless :meth:`halt` did) and start it again on the same port and
        data directory.

        For fault tests: every connection is dropped. ``mode="fast"`` is a clean shutdown
        (SIGINT, checkpoint); ``mode="immediate"`` is SIGQUIT, so the restart runs crash
        recovery from the WAL, as after a power loss of the server process.

        Raises:
            ValueError: *mode* is not ``"fast"`` or ``"immediate"``.
            EmbeddedPostgresError: the server did not accept connections again within *timeout*
                seconds, or its port was taken in between.
        """
        _stop_signal(mode)
        self._finalizer.detach()  # keep the data directory
        self.halt(mode)
        proc = _spawn_postgres(find_bindir(), self.datadir, _server_account(), self.port)
        self._adopt(proc)
        _await_accepting(proc, self.dsn, self.log_path, self.datadir, timeout)

    def start_standby(
        self, *, application_name: str = "standby", timeout: float = START_TIMEOUT
    ) -> TempServer:
        """A streaming hot standby of this server: ``pg_basebackup -X stream -R`` into a fresh
        throwaway directory, started on a port of its own; stop it with :meth:`stop` (its
        directory goes with it). For failover tests: promote it with :meth:`promote`.

        Args:
            application_name: the name the standby's WAL receiver gives this server (what
                ``synchronous_standby_names`` lists to make it a synchronous standby).
            timeout: seconds to wait for the standby to accept (read-only) connections.

        Raises:
            EmbeddedPostgresError: the base backup failed (this server must allow replication
                connections: ``start_temp``'s do), or the standby did not start.
        """
        bindir = find_bindir()
        acct = _server_account()
        datadir = Path(
            tempfile.mkdtemp(prefix=f"{_TEMP_PREFIX}{os.getpid()}-", dir=self.datadir.parent)
        )
        try:
            if acct.switch:
                os.chown(datadir, acct.uid, acct.gid)
            conninfo = (
                f"host=127.0.0.1 port={self.port} user=postgres application_name={application_name}"
            )
            _run_tool(
                [
                    bindir / "pg_basebackup",
                    "-D",
                    datadir,
                    "-d",
                    conninfo,
                    "-X",
                    "stream",
                    "-R",
                    "-c",
                    "fast",
                    "--no-sync",
                ],  # fmt: skip
                acct,
                f"pg_basebackup from port {self.port}",
            )
            return _start_temp_postgres(bindir, datadir, acct, timeout)
        except BaseException:
            shutil.rmtree(datadir, ignore_errors=True)
            raise

    def promote(self, *, timeout: float = START_TIMEOUT) -> None:
        """``pg_ctl promote -w``: end this standby's recovery and make it a primary; returns
        once it accepts writes.

        Raises:
            EmbeddedPostgresError: it is not a standby, or was not promoted within ``timeout``
                seconds.
        """
        _run_tool(
            [find_bindir() / "pg_ctl", "promote", "-w", "-t", int(timeout), "-D", self.datadir],
            _server_account(),
            f"pg_ctl promote -D {self.datadir}",
            self.log_path,
        )

    def __enter__(self) -> TempServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<TempServer {self.dsn} pid={self.pid} {'running' if self.running else 'stopped'}>"


def start_temp(*, timeout: float = START_TIMEOUT) -> TempServer:
    """Initialise and start a throwaway PostgreSQL for tests.

    Runs ``initdb`` (trust auth, superuser ``postgres``, ``--locale=C``, UTF8) into a fresh
    ``/tmp/awa-pg-t<pid>-XXXX`` (parent overridable with ``$AWA_PG_TMPDIR``) and starts
    ``postgres`` as a direct child listening on 127.0.0.1 at a free port and on a unix socket in
    the data directory, with ``fsync=off``, ``full_page_writes=off``, ``max_connections=200``
    and ``shared_buffers=128MB``. On a port clash it retries with another port (3 attempts).
    Stale directories of earlier runs whose owner process is dead are removed first.

    Call it from the main thread or another long-lived thread: the parent-death signal fires
    when the *thread* that started the server exits. Takes about 0.4-1.2 s (initdb dominates).

    Args:
        timeout: seconds to wait for the server to accept connections.

    Returns:
        a running :class:`TempServer`.

    Raises:
        EmbeddedPostgresError: binaries not found, initdb failed, or the server did not accept
            connections within *timeout* (the message ends with the server log).
    """
    bindir = find_bindir()
    acct = _server_account()
    parent = Path(os.environ.get("AWA_PG_TMPDIR") or "/tmp")
    _remove_stale_temp_dirs(parent)
    datadir = Path(tempfile.mkdtemp(prefix=f"{_TEMP_PREFIX}{os.getpid()}-", dir=parent))
    try:
        if len(os.fsencode(datadir / ".s.PGSQL.65535")) > MAX_SOCKET_PATH:
            raise EmbeddedPostgresError(
                f"socket path under {datadir} would be too long; set AWA_PG_TMPDIR shorter"
            )
        if acct.switch:
            _check_traversable(datadir, acct)
            os.chown(datadir, acct.uid, acct.gid)
        _initdb(bindir, datadir, acct, nosync=True)
        return _start_temp_postgres(bindir, datadir, acct, timeout)
    except BaseException:
        shutil.rmtree(datadir, ignore_errors=True)
        raise


def _spawn_postgres(bindir: Path, datadir: Path, acct: _Account, port: int) -> subprocess.Popen:
    """Start the postmaster of the throwaway cluster *datadir* on *port* (log appended)."""
    argv = [
        str(bindir / "postgres"), "-D", str(datadir), "-p", str(port),
        "-k", str(datadir), "-h", "127.0.0.1",
        "-c", "fsync=off", "-c", "synchronous_commit=on", "-c", "full_page_writes=off",
        "-c", "max_connections=200", "-c", "shared_buffers=128MB",
    ]  # fmt: skip
    with open(datadir / "server.log", "ab") as log:
        if acct.switch:
            os.fchown(log.fileno(), acct.uid, acct.gid)
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=str(datadir),
            env=_server_env(),
            preexec_fn=_make_pdeathsig_preexec(),
            start_new_session=True,  # a Ctrl-C in the terminal must not kill it mid-teardown
            **acct.popen_kwargs(),
        )


class _PortClash(Exception):
    pass


def _await_accepting(
    proc: subprocess.Popen, dsn: str, log_path: Path, datadir: Path, timeout: float
) -> None:
    """Wait until *proc* accepts connections on *dsn*.

    Raises:
        _PortClash: the postmaster exited because its port was taken.
        EmbeddedPostgresError: it exited otherwise, or did not accept within *timeout* seconds.
    """
    import psycopg

    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            text = log_path.read_text(errors="replace")
            if "could not bind" in text or "Address already in use" in text:
                raise _PortClash(f"postgres exited with status {proc.returncode}")
            raise EmbeddedPostgresError(
                f"postgres exited with status {proc.returncode} while starting in {datadir}"
                + _log_tail(log_path)
            )
        try:
            with psycopg.connect(dsn, connect_timeout=2, autocommit=True):
                return
        except psycopg.OperationalError:
            pass
        if time.monotonic() > deadline:
            _stop_proc(proc)
            raise EmbeddedPostgresError(
                f"PostgreSQL in {datadir} did not accept connections within {timeout:.0f} s"
                + _log_tail(log_path)
            )
        try:  # doubles as the poll interval and as early-exit detection
            proc.wait(timeout=0.02)
        except subprocess.TimeoutExpired:
            pass


def _start_temp_postgres(bindir: Path, datadir: Path, acct: _Account, timeout: float) -> TempServer:
    log_path = datadir / "server.log"
    last_error = ""
    for _attempt in range(3):
        port = _free_port()
        log_path.unlink(missing_ok=True)  # a clash's log must not be read as the next try's
        proc = _spawn_postgres(bindir, datadir, acct, port)
        try:
            _await_accepting(
                proc, f"postgresql://postgres@127.0.0.1:{port}/postgres", log_path, datadir, timeout
            )
        except _PortClash as clash:
            last_error = str(clash)
            continue
        return TempServer(proc, port, datadir)
    raise EmbeddedPostgresError(
        f"could not find a free port after 3 attempts ({last_error})" + _log_tail(log_path)
    )


# --------------------------------------------------------------------------------------------
# persistent server (CLI default)
