"""A PgBouncer process of its own in front of a PostgreSQL server: Debian's package
(``apt-get install pgbouncer``, in /usr/sbin), run as the account the throwaway server runs as
(PgBouncer refuses root). Used by the pooler and multi-host tests (tests/deploy/test_pooler.py,
tests/deploy/test_hosts.py) and by the bench's ``hosts`` scenario (bench/hosts.py).

A missing ``pgbouncer`` raises :class:`PgBouncerError`; the tests let it fail them (never a
skip).
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence

from psycopg.conninfo import conninfo_to_dict, make_conninfo

PGBOUNCER = shutil.which("pgbouncer", path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")


class PgBouncerError(RuntimeError):
    """PgBouncer is not installed, or did not start (the message holds its log)."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class PgBouncer:
    """PgBouncer in ``pool_mode`` in front of the server of ``server_dsn``, listening on every
    address of ``listen`` (IPv4 strings) at :attr:`port`, with ``default_pool_size`` server
    connections per database/user pair, and any other ``[pgbouncer]`` ``settings`` (name to
    value, e.g. ``{"query_wait_timeout": 0}``). ``workdir`` holds its configuration and log.

    Raises:
        PgBouncerError: not installed, or not accepting connections within 15 s.
    """

    def __init__(
        self,
        server_dsn: str,
        workdir: pathlib.Path,
        pool_mode: str = "transaction",
        *,
        listen: Sequence[str] = ("127.0.0.1",),
        default_pool_size: int = 8,
        max_client_conn: int = 200,
        settings: dict[str, str | int] | None = None,
    ):
        from awa_fast.embedded.cluster import _server_account  # the test server's account

        if PGBOUNCER is None:
            raise PgBouncerError("pgbouncer is not installed: apt-get install -y pgbouncer")
        params = conninfo_to_dict(server_dsn)
        self.listen = tuple(listen)
        self.port = free_port(self.listen[0])
        user = params.get("user", "postgres")
        (workdir / "users.txt").write_text(f'"{user}" ""\n')
        self.log = workdir / "pgbouncer.log"
        ini = workdir / "pgbouncer.ini"
        ini.write_text(
            "[databases]\n"
            f"* = host={params.get('host', '127.0.0.1')} port={params.get('port', 5432)}\n"
            "[pgbouncer]\n"
            f"listen_addr = {','.join(self.listen)}\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {workdir / 'users.txt'}\n"
            f"pool_mode = {pool_mode}\n"
            f"default_pool_size = {default_pool_size}\n"
            f"max_client_conn = {max_client_conn}\n"
            + "".join(f"{k} = {v}\n" for k, v in (settings or {}).items())
            + f"logfile = {self.log}\n"
            f"pidfile = {workdir / 'pgbouncer.pid'}\n"
        )
        account = _server_account()
        os.chown(workdir, account.uid, account.gid)
        for f in workdir.iterdir():
            os.chown(f, account.uid, account.gid)
        self.proc = subprocess.Popen(  # it logs to its logfile too
            [PGBOUNCER, str(ini)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            **account.popen_kwargs(),
        )
        self.params = params
        deadline = time.monotonic() + 15
        for host in self.listen:
            while True:  # polled: a child process's listening socket has no signal of its own
                with contextlib.suppress(OSError), socket.create_connection((host, self.port)):
                    break
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    log = self.log.read_text() if self.log.exists() else "(no log)"
                    raise PgBouncerError(f"pgbouncer did not start:\n{log}")
                time.sleep(0.05)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def url(self, dsn: str, host: str | None = None) -> str:
        """``dsn``'s database through this PgBouncer, at ``host`` (one of its listen addresses;
        default the first)."""
        params = conninfo_to_dict(dsn)
        params.update(host=host or self.listen[0], port=str(self.port))
        return make_conninfo(**params)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@contextlib.contextmanager
def running(server_dsn: str, pool_mode: str = "transaction", **options) -> Iterator[PgBouncer]:
    """A :class:`PgBouncer` (``options`` as its keywords) stopped and cleaned up afterwards.
    Its own directory under /tmp: a directory under root's home (pytest's ``tmp_path``) is not
    reachable for the unprivileged account PgBouncer runs as."""
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="awa-pgbouncer-"))
    try:
        b = PgBouncer(server_dsn, workdir, pool_mode, **options)
        try:
            yield b
        finally:
            b.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
