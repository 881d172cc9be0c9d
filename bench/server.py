"""The PostgreSQL server a benchmark run uses.

``start_durable()`` starts a throwaway cluster from the same binaries as
``awa_fast.embedded.start_temp()``, but with ``fsync=on`` and ``full_page_writes=on``
(``start_temp`` passes ``fsync=off`` / ``full_page_writes=off`` on the postgres command line,
and command-line settings outrank ``ALTER SYSTEM``, so they cannot be switched back on a
running ``start_temp`` server). ``synchronous_commit=on`` in both cases.

``--unsafe-fsync-off`` uses ``start_temp()`` as is (faster, not durable across an OS crash).

``warm_wal()`` gives a fresh durable cluster the recycled WAL segments a server that has run for
a while has: until its first checkpoints, a fresh cluster creates each new 16 MB segment on the
commit path (zero-filled and fsynced while every commit waits), which measured as 60-150 ms
COMMITs for the first two minutes of an 8,000 jobs/s soak and none afterwards
(docs/benchmarking.md).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

from awa_fast.embedded import TempServer
from awa_fast.embedded import cluster as emb

DURABLE_SETTINGS = {
    "fsync": "on",
    "synchronous_commit": "on",
    "full_page_writes": "on",
    "max_connections": "200",
    "shared_buffers": "128MB",
}


def start_durable(settings: dict[str, str] | None = None, timeout: float = 60.0) -> TempServer:
    """A throwaway server like ``start_temp()`` with durable settings (or ``settings``)."""
    settings = dict(DURABLE_SETTINGS if settings is None else settings)
    bindir = emb.find_bindir()
    acct = emb._server_account()
    parent = Path(os.environ.get("AWA_PG_TMPDIR") or "/tmp")
    emb._remove_stale_temp_dirs(parent)
    datadir = Path(tempfile.mkdtemp(prefix=f"{emb._TEMP_PREFIX}{os.getpid()}-", dir=parent))
    try:
        if acct.switch:
            emb._check_traversable(datadir, acct)
            os.chown(datadir, acct.uid, acct.gid)
        emb._initdb(bindir, datadir, acct, nosync=True)
        log_path = datadir / "server.log"
        port = emb._free_port()
        argv = [
            str(bindir / "postgres"),
            "-D",
            str(datadir),
            "-p",
            str(port),
            "-k",
            str(datadir),
            "-h",
            "127.0.0.1",
        ]
        for key, value in settings.items():
            argv += ["-c", f"{key}={value}"]
        with open(log_path, "wb") as log:
            if acct.switch:
                os.fchown(log.fileno(), acct.uid, acct.gid)
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=str(datadir),
                env=emb._server_env(),
                preexec_fn=emb._make_pdeathsig_preexec(),
                start_new_session=True,
                **acct.popen_kwargs(),
            )
        dsn = f"postgresql://postgres@127.0.0.1:{port}/postgres"
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise emb.EmbeddedPostgresError(
                    "postgres exited at start" + emb._log_tail(log_path)
                )
            try:
                with psycopg.connect(dsn, connect_timeout=2, autocommit=True):
                    pass
                return TempServer(proc, port, datadir)
            except psycopg.OperationalError:
                pass
            if time.monotonic() > deadline:
                emb._stop_proc(proc)
                raise emb.EmbeddedPostgresError(
                    "postgres did not accept connections" + emb._log_tail(log_path)
                )
            time.sleep(0.05)
    except BaseException:
        shutil.rmtree(datadir, ignore_errors=True)
        raise


# start_temp()'s settings (tests): fast, not durable.
TEST_SETTINGS = {**DURABLE_SETTINGS, "fsync": "off", "full_page_writes": "off"}


def start_for_hosts(
    addresses: list[str], subnets: list[str], settings: dict[str, str] | None = None
) -> TempServer:
    """A throwaway server (``start_durable(settings)``) that also listens on ``addresses`` (the
    root side of each worker namespace's link, bench/netns.py) and trusts connections from
    ``subnets`` (CIDR strings) in its pg_hba.conf. Returns once a connection over the first
    address is accepted."""
    settings = dict(DURABLE_SETTINGS if settings is None else settings)
    settings["listen_addresses"] = ",".join(["127.0.0.1", *addresses])
    server = start_durable(settings)
    try:
        with open(server.datadir / "pg_hba.conf", "a") as hba:
            for subnet in subnets:
                hba.write(f"host all all {subnet} trust\n")
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_reload_conf()")
        if addresses:
            probe = server.dsn.replace("127.0.0.1", addresses[0])
            deadline = time.monotonic() + 10
            while True:  # polled: the postmaster rereads pg_hba.conf on its own time
                try:
                    psycopg.connect(probe, connect_timeout=2).close()
                    break
                except psycopg.OperationalError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
    except BaseException:
        server.stop()
        raise
    return server


def warm_wal(admin_dsn: str) -> dict[str, float]:
    """Write about ``max_wal_size`` of WAL into a scratch table, drop it and checkpoint, so the
    segments already exist and are recycled from then on (see the module docstring). Run once
    per fresh server before any system, so every system meets the same warm server. Returns
    the WAL bytes written, the segments in ``pg_wal`` afterwards and the seconds taken."""
    started = time.monotonic()
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        target = conn.execute("SELECT pg_size_bytes(current_setting('max_wal_size'))").fetchone()[0]
        start_lsn = conn.execute("SELECT pg_current_wal_lsn()").fetchone()[0]
        conn.execute("CREATE TABLE bench_wal_warmup (filler text)")
        written = 0
        while written < target:
            conn.execute(
                "INSERT INTO bench_wal_warmup SELECT repeat(md5(g::text), 60)"
                " FROM generate_series(1, 20000) AS g"
            )
            conn.execute("TRUNCATE bench_wal_warmup")
            written = conn.execute(
                "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), %s)", (start_lsn,)
            ).fetchone()[0]
        conn.execute("DROP TABLE bench_wal_warmup")
        conn.execute("CHECKPOINT")
        segments = conn.execute("SELECT count(*) FROM pg_ls_waldir()").fetchone()[0]
    return {
        "wal_bytes": float(written),
        "segments": float(segments),
        "seconds": time.monotonic() - started,
    }


def create_database(admin_dsn: str, name: str) -> str:
    """Create a fresh database ``name`` (dropping an old one) and return its DSN."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return dsn_for(admin_dsn, name)


def drop_database(admin_dsn: str, name: str) -> None:
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def dsn_for(admin_dsn: str, dbname: str) -> str:
    """A ``postgresql://`` URL for ``dbname`` on the server of ``admin_dsn`` (URL form: asyncpg
    and awa-pg accept only URLs)."""
    from urllib.parse import quote

    from psycopg.conninfo import conninfo_to_dict

    p = conninfo_to_dict(admin_dsn)
    user = quote(p.get("user") or "postgres", safe="")
    auth = user + (":" + quote(p["password"], safe="") if p.get("password") else "")
    host = p.get("host") or "localhost"
    query = ""
    if host.startswith("/"):
        query, host = f"?host={quote(host, safe='/')}", ""
    port = f":{p['port']}" if p.get("port") else ""
    return f"postgresql://{auth}@{host}{port}/{quote(dbname, safe='')}{query}"
