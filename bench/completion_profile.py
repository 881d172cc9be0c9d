"""Where the work per job goes in the claim and the compact completion, in counts a loaded
machine does not change (issue 32; docs/benchmarking.md, "Where the work per job goes").

    python -m bench.completion_profile [--jobs N] [--batch B] [--key-every K] [--worker]

A throwaway durable server (``bench.server.start_durable``) with ``pg_stat_statements``
(``track = all``, so the statements the triggers run are listed too), ``track_functions = all``
and autovacuum off. ``--jobs`` no-op rows are inserted, then drained by one connection the way
the dispatcher and finalizer do it: ``sql.CLAIM`` of ``--batch`` rows, then ``sql.COMPLETE_MANY``
of those rows (sorted by id), each its own transaction, prepared after psycopg's fifth use.
``--key-every K`` gives every K-th job a unique key (0: none), so the key check's path is counted
too. Printed per completed job: statements and their calls, rows, shared buffers hit / dirtied,
WAL records / full-page images / bytes (``pg_stat_statements``, top level and nested), plpgsql
function calls (``pg_stat_user_functions``), tuples inserted / updated / deleted and dead tuples
left per table (``pg_stat_user_tables``), index scans and entries read per table
(``pg_stat_user_indexes``), and the server's WAL (``pg_stat_wal``). Timings are left out on
purpose: take them on a quiet machine with ``awa-fast bench``.

``--worker`` also drains ``--jobs`` no-op jobs with the bench's awa-fast worker (one process,
``bench.systems.awa_fast_sys``) under ``cProfile`` and prints Python function calls per job,
the most called first (call counts only). Functions called once per row count the same on any
machine; those called once per claim or completion batch follow the batch sizes the run got.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import re

import psycopg

import awa_fast as awa
from awa_fast import sql
from bench import server

SETTINGS = {
    **server.DURABLE_SETTINGS,
    "shared_preload_libraries": "pg_stat_statements",
    "pg_stat_statements.track": "all",
    "pg_stat_statements.max": "5000",
    "track_functions": "all",
    "autovacuum": "off",  # dead tuples per job are read as left by the statements themselves
    "checkpoint_timeout": "1h",  # no checkpoint inside the measured drain: FPIs stay put
    "max_wal_size": "4GB",
}


def _short(query: str, width: int = 70) -> str:
    text = re.sub(r"\s+", " ", query).strip()
    return text if len(text) <= width else text[: width - 1] + "…"


def _seed(dsn: str, jobs: int, key_every: int) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        conn.execute(
            "INSERT INTO awa_fast.jobs (kind, queue, args, unique_key, unique_states) "
            "SELECT 'noop', 'bench', jsonb_build_object('n', g), "
            "CASE WHEN %(k)s > 0 AND g %% %(k)s = 0 THEN sha224(g::text::bytea) END, "
            "CASE WHEN %(k)s > 0 AND g %% %(k)s = 0 THEN 15 END "
            "FROM generate_series(1, %(n)s) g",
            {"n": jobs, "k": key_every},
        )
        conn.execute("VACUUM ANALYZE")
        conn.execute("CHECKPOINT")


def _drain(dsn: str, batch: int) -> int:
    params = {"queue": "bench", "limit": batch, "deadline_ms": 0, "kinds": ["noop"]}
    done = 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_statements_reset()")
        conn.execute("SELECT pg_stat_reset()")
        conn.execute("SELECT pg_stat_reset_shared('wal')")
        while True:
            rows = conn.execute(sql.CLAIM, params).fetchall()
            if not rows:
                break
            attempts = sorted((r[0], r[13]) for r in rows)
            finished = conn.execute(
                sql.COMPLETE_MANY, ([i for i, _ in attempts], [lease for _, lease in attempts])
            ).fetchall()
            if len(finished) != len(attempts):
                raise RuntimeError(f"completed {len(finished)} of {len(attempts)}")
            done += len(finished)
    return done  # the connection's exit flushes its statistics


def _report(dsn: str, jobs: int) -> None:
    per = float(jobs)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        print(f"\nper completed job ({jobs} jobs)\n")
        print("statements (pg_stat_statements; top = sent by the worker, nested = run by triggers)")
        print(
            f"{'':4}{'calls':>7} {'rows':>7} {'hit':>7} {'dirtied':>7} {'wal rec':>7} "
            f"{'wal fpi':>7} {'wal B':>8}  statement"
        )
        rows = conn.execute(
            "SELECT toplevel, calls, rows, shared_blks_hit, shared_blks_dirtied, wal_records,"
            " wal_fpi, wal_bytes, query FROM pg_stat_statements"
            " WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
            "   AND query !~* '^\\s*(select pg_stat|begin|commit)'"
            " ORDER BY toplevel DESC, calls DESC, wal_bytes DESC"
        ).fetchall()
        for top, calls, nrows, hit, dirtied, rec, fpi, wal, query in rows:
            if calls / per < 0.001:
                continue
            print(
                f"{'top' if top else 'nest':4}{calls / per:7.3f} {nrows / per:7.3f} "
                f"{hit / per:7.2f} {dirtied / per:7.3f} {rec / per:7.2f} {fpi / per:7.3f} "
                f"{float(wal) / per:8.1f}  {_short(query)}"
            )
        top = [r for r in rows if r[0]]
        print(
            f"{'all':4}{sum(r[1] for r in top) / per:7.3f} {'':7} "
            f"{sum(r[3] for r in top) / per:7.2f} {sum(r[4] for r in top) / per:7.3f} "
            f"{sum(r[5] for r in top) / per:7.2f} {sum(r[6] for r in top) / per:7.3f} "
            f"{float(sum(r[7] for r in top)) / per:8.1f}  (top-level totals, triggers included)"
        )
        print(f"nested statements per job: {sum(r[1] for r in rows if not r[0]) / per:.3f}")

        print("\nfunction calls (pg_stat_user_functions)")
        for name, calls in conn.execute(
            "SELECT schemaname || '.' || funcname, calls FROM pg_stat_user_functions"
            " WHERE schemaname = 'awa_fast' AND calls >= %s ORDER BY calls DESC, funcname",
            (jobs / 1000,),
        ):
            print(f"{calls / per:9.3f}  {name}")

        print("\nrows written and left dead (pg_stat_user_tables; index scans / entries read)")
        print(
            f"{'ins':>7} {'upd':>7} {'hot':>7} {'del':>7} {'dead':>7} {'idx scan':>8} "
            f"{'idx read':>8}  table"
        )
        for name, ins, upd, hot, dele, dead, scans, read in conn.execute(
            "SELECT t.relname, t.n_tup_ins, t.n_tup_upd, t.n_tup_hot_upd, t.n_tup_del,"
            " t.n_dead_tup, COALESCE(sum(i.idx_scan), 0), COALESCE(sum(i.idx_tup_read), 0)"
            " FROM pg_stat_user_tables t LEFT JOIN pg_stat_user_indexes i USING (relid)"
            " WHERE t.schemaname = 'awa_fast' GROUP BY 1, 2, 3, 4, 5, 6"
            " HAVING t.n_tup_ins + t.n_tup_upd + t.n_tup_del + COALESCE(sum(i.idx_scan), 0) > 0"
            " ORDER BY 1"
        ):
            print(
                f"{ins / per:7.3f} {upd / per:7.3f} {hot / per:7.3f} {dele / per:7.3f} "
                f"{dead / per:7.3f} {float(scans) / per:8.3f} {float(read) / per:8.3f}  {name}"
            )

        rec, fpi, wal = conn.execute(
            "SELECT wal_records, wal_fpi, wal_bytes FROM pg_stat_wal"
        ).fetchone()
        print(
            f"\nserver WAL (pg_stat_wal): {rec / per:.2f} records, {fpi / per:.3f} full-page "
            f"images, {float(wal) / per:.1f} bytes per job"
        )


async def _worker_drain(dsn: str, jobs: int, top: int) -> None:
    from bench.systems.awa_fast_sys import Adapter

    system = Adapter()
    await system.setup(dsn)
    seeded = await system.seed(dsn, "noop", jobs)
    go, stop = asyncio.Event(), asyncio.Event()
    profile = cProfile.Profile()

    async def until_drained() -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            while True:
                cur = await conn.execute(system.count_query("noop"))
                if (await cur.fetchone())[0] >= seeded:
                    break
                await asyncio.sleep(0.2)
        stop.set()

    worker = asyncio.create_task(system.run_worker(dsn, "noop", 64, go, stop, lambda: None))
    profile.enable()
    go.set()
    await until_drained()
    await worker
    profile.disable()
    stats = pstats.Stats(profile)
    counted = [
        (calls, path, f"{name} ({'/'.join(path.split('/')[-2:])}:{line})")
        for (path, line, name), (_, calls, _, _, _) in stats.stats.items()  # type: ignore[attr-defined]
    ]
    counted.sort(reverse=True)
    total = sum(calls for calls, _, _ in counted)
    print(f"\nworker (one process, 64 slots, {seeded} no-op jobs, cProfile call counts)")
    print(f"{total / seeded:9.1f}  Python function calls per job, all functions")
    print("most called, any module:")
    for calls, _, name in counted[:top]:
        print(f"{calls / seeded:9.2f}  {name}")
    print("most called in awa_fast:")
    for calls, _, name in [c for c in counted if "/awa_fast/" in c[1]][:top]:
        print(f"{calls / seeded:9.2f}  {name}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.completion_profile")
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--batch", type=int, default=100, help="rows per claim and completion")
    parser.add_argument("--key-every", type=int, default=0, help="every K-th job has a key")
    parser.add_argument("--worker", action="store_true", help="also count the worker's calls")
    args = parser.parse_args(argv)
    if args.jobs < 1 or args.batch < 1 or args.key_every < 0:
        parser.error("--jobs and --batch must be at least 1, --key-every at least 0")
    srv = server.start_durable(SETTINGS)
    try:
        admin = srv.dsn
        dsn = server.create_database(admin, "completion_profile")
        asyncio.run(awa.migrate(dsn))
        _seed(dsn, args.jobs, args.key_every)
        done = _drain(dsn, args.batch)
        if done != args.jobs:
            raise RuntimeError(f"drained {done} of {args.jobs}")
        print(f"claim and compact completion, batch {args.batch}, key every {args.key_every}")
        _report(dsn, done)
        if args.worker:
            asyncio.run(
                _worker_drain(server.create_database(admin, "worker_profile"), args.jobs, 30)
            )
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
