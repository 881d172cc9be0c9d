"""The per-job staged completion statement alone, without a worker: how many a second the
server sustains and how much of its CPU each costs (issue 11; docs/benchmarking.md, "Where a
per-job completion's CPU goes").

    python -m bench.staged_statement [--database-url URL] [--jobs N] [--connections K]
                                     [--rounds R] [--async-commit] [--pipeline W]

Each round creates a fresh database, migrates it, inserts ``--jobs`` running stage-A rows (one
run_lease each) and completes every one with ``sql.COMPLETE_WITH_FOLLOW_UPS`` staging one
stage-B follow-up with ``unique_opts={}`` (every B value staged by two A's, as the bench's
pipeline scenario), split over ``--connections`` threads, each with its own connection, the
statement prepared as the finalizer's is. Printed per round: completions a second and the
server backends' CPU per completion in microseconds, read from ``/proc/<pid>/stat`` (so the
server must run on this machine). ``--async-commit`` sets ``synchronous_commit = off`` on the
connections, leaving the statement's own cost without the commit's flush. ``--pipeline W``
sends each connection's statements in libpq's pipeline mode, at most W in flight, each followed
by its own Sync, so each is still its own transaction: what a worker that pipelined its
per-job completions would save (docs/benchmarking.md, "Pipelined per-job transactions"). Without
``--database-url`` a durable throwaway server is started (``bench.server.start_durable``).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import threading
import time

import psycopg
from psycopg import pq

import awa_fast as awa
from awa_fast import enqueue, sql
from awa_fast.worker.follow_ups import build_request
from bench import server

WARM = 6  # statements per connection before timing: psycopg prepares on its 5th use


@dataclasses.dataclass
class StageB:
    v: int


def _backend_cpu_s(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _run_pipelined(conn, share: list[int], staged: dict, window: int) -> None:
    # Bind/Execute/Sync per completion: the Sync ends that completion's implicit transaction.
    parts = sql.COMPLETE_WITH_FOLLOW_UPS.split("%s")
    text = parts[0] + "".join(f"${n}{part}" for n, part in enumerate(parts[1:], start=1))
    pg = conn.pgconn
    pg.enter_pipeline_mode()
    pg.send_prepare(b"staged", text.encode(), None)
    pg.pipeline_sync()
    sent, done = 0, -1  # the prepare is settled first
    while done < len(share):
        while sent < len(share) and sent - done < window:
            i = share[sent]
            pg.send_query_prepared(b"staged", [str(i).encode(), b"1", staged[i].encode()])
            pg.pipeline_sync()
            sent += 1
        pg.flush()
        res = pg.get_result()
        if res.status not in (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK):
            raise RuntimeError(res.error_message.decode())
        if pg.get_result() is not None or pg.get_result().status != pq.ExecStatus.PIPELINE_SYNC:
            raise RuntimeError("unexpected pipeline result")
        done += 1
    pg.exit_pipeline_mode()


def measure(
    admin_dsn: str, name: str, jobs: int, connections: int, async_commit: bool, window: int
) -> tuple[float, float]:
    """One round in a fresh database ``name`` on ``admin_dsn``'s server: ``jobs`` stage-A
    completions, each staging one stage-B, over ``connections`` connections. Returns
    (completions a second, backend CPU per completion in microseconds)."""
    dsn = server.create_database(admin_dsn, name)
    try:
        asyncio.run(awa.migrate(dsn))
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO awa_fast.jobs (kind, queue, args) SELECT 'stage_a', 'bench', "
                "jsonb_build_object('n', g) FROM generate_series(1, %s) g",
                (jobs,),
            )
            conn.execute(
                "UPDATE awa_fast.jobs SET state = 'running', run_lease = 1, attempt = 1, "
                "attempted_at = now(), heartbeat_at = now()"
            )
            conn.execute("VACUUM ANALYZE awa_fast.jobs")
            conn.execute("CHECKPOINT")
            ids = [r[0] for r in conn.execute("SELECT id FROM awa_fast.jobs ORDER BY id")]
        staged = {
            i: enqueue.follow_ups_json(
                [build_request(StageB(i // 2), {"queue": "bench", "unique_opts": {}}, i, None)]
            )
            for i in ids
        }
        conns = [psycopg.connect(dsn, autocommit=True) for _ in range(connections)]
        try:
            pids = []
            for k, conn in enumerate(conns):
                if async_commit:
                    conn.execute("SET synchronous_commit = off")
                pids.append(conn.execute("SELECT pg_backend_pid()").fetchone()[0])
                for i in ids[k * WARM : (k + 1) * WARM]:
                    conn.execute(sql.COMPLETE_WITH_FOLLOW_UPS, (i, 1, staged[i])).fetchone()
            timed = ids[connections * WARM :]

            def run(conn, share: list[int]) -> None:
                if window:
                    _run_pipelined(conn, share, staged, window)
                    return
                for i in share:
                    conn.execute(sql.COMPLETE_WITH_FOLLOW_UPS, (i, 1, staged[i])).fetchone()

            threads = [
                threading.Thread(target=run, args=(conns[k], timed[k::connections]))
                for k in range(connections)
            ]
            cpu0, t0 = sum(map(_backend_cpu_s, pids)), time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            elapsed = time.perf_counter() - t0
            cpu = sum(map(_backend_cpu_s, pids)) - cpu0
        finally:
            for conn in conns:
                conn.close()
        return len(timed) / elapsed, cpu * 1e6 / len(timed)
    finally:
        server.drop_database(admin_dsn, name)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.staged_statement", description=__doc__)
    p.add_argument("--database-url", help="an admin DSN of a local server (default: start one)")
    p.add_argument("--jobs", type=int, default=8000)
    p.add_argument("--connections", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--async-commit", action="store_true")
    p.add_argument(
        "--pipeline", type=int, default=0, metavar="W", help="pipeline mode, W in flight"
    )
    args = p.parse_args(argv)
    owned = None
    admin = args.database_url
    if admin is None:
        owned = server.start_durable()
        admin = owned.dsn
    try:
        for r in range(args.rounds):
            rate, cpu_us = measure(
                admin,
                f"bench_staged_statement_{r}",
                args.jobs,
                args.connections,
                args.async_commit,
                args.pipeline,
            )
            print(
                f"round {r + 1}: {rate:,.0f} completions/s, backend CPU {cpu_us:.0f} us each "
                f"({args.connections} connections, {args.jobs} jobs, "
                f"synchronous_commit {'off' if args.async_commit else 'on'}"
                f"{f', pipelined {args.pipeline} deep' if args.pipeline else ''})",
                flush=True,
            )
    finally:
        if owned is not None:
            owned.stop()


if __name__ == "__main__":
    main()
