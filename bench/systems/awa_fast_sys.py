"""awa-fast adapter."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time

import awa_fast as awa
from bench.soak import pickup
from bench.systems import NotSupported, dist_version

QUEUE = "bench"


@dataclasses.dataclass
class Noop:
    n: int


@dataclasses.dataclass
class FailMix:
    n: int
    mode: int  # 0: RetryAfter(0) once, 1: TerminalError, 2: Snooze(0) once


@dataclasses.dataclass
class StageA:
    n: int


@dataclasses.dataclass
class StageB:
    v: int


@dataclasses.dataclass
class Ping:
    i: int


@dataclasses.dataclass
class SoakJob:
    t: float  # epoch seconds, stamped by the soak producer just before the insert call


class SoakProducer:
    method = "enqueue_many_copy (one call per tick)"

    def __init__(self, client: awa.AsyncClient):
        self.client = client

    async def insert(self, n: int, t: float) -> None:
        await self.client.enqueue_many_copy([SoakJob(t)] * n, queue=QUEUE)

    async def close(self) -> None:
        await self.client.close()


class Adapter:
    name = "awa_fast"
    dist = "awa-fast"

    def __init__(self):
        self.version = dist_version(self.dist)

    async def setup(self, dsn: str) -> dict:
        await awa.migrate(dsn)
        return {"engine": "awa_fast (single table)"}

    # -- enqueue ------------------------------------------------------------------------------

    async def enqueue(self, dsn: str, mode: str, n: int, batch: int) -> dict:
        client = awa.AsyncClient(dsn, max_connections=4)
        try:
            await client.pool()
            if mode == "single":
                t = time.perf_counter()
                for i in range(n):
                    await client.insert(Noop(i), queue=QUEUE)
                return {"elapsed": time.perf_counter() - t, "method": "AsyncClient.insert"}
            if mode == "many":
                jobs = [Noop(i) for i in range(n)]
                t = time.perf_counter()
                for k in range(0, n, batch):
                    await client.insert_many(jobs[k : k + batch], queue=QUEUE)
                return {
                    "elapsed": time.perf_counter() - t,
                    "method": f"insert_many (batches of {batch})",
                }
            if mode == "copy":
                # insert_many_copy (returns Jobs) is the target's reference; enqueue_many_copy
                # (returns a count, like awa-pg's) is measured too and kept in alternatives.
                results = {}
                for off, method in enumerate(("insert_many_copy", "enqueue_many_copy")):
                    jobs = [Noop(off * n + i) for i in range(n)]
                    t = time.perf_counter()
                    await getattr(client, method)(jobs, queue=QUEUE)
                    results[method] = time.perf_counter() - t
                return {
                    "elapsed": results["insert_many_copy"],
                    "method": "insert_many_copy (one call)",
                    "alternatives_per_s": {k: round(n / v, 1) for k, v in results.items()},
                }
            if mode == "unique":
                # unique_opts={} (awa's defaults: by args). Both paths, on disjoint args so the
                # keys do not collide; the faster one is reported, the other kept alongside.
                results = {}
                for off, method in enumerate(
                    ("insert_many_copy", "enqueue_many_copy", "insert_many")
                ):
                    jobs = [Noop(off * n + i) for i in range(n)]
                    fn = getattr(client, method)
                    t = time.perf_counter()
                    if method != "insert_many":
                        await fn(jobs, queue=QUEUE, unique_opts={})
                    else:
                        for k in range(0, n, batch):
                            await fn(jobs[k : k + batch], queue=QUEUE, unique_opts={})
                    results[method] = time.perf_counter() - t
                best = min(results, key=results.get)
                label = best if best != "insert_many" else f"insert_many (batches of {batch})"
                return {
                    "elapsed": results[best],
                    "method": f"{label}, unique_opts={{}}",
                    "alternatives_per_s": {k: round(n / v, 1) for k, v in results.items()},
                }
            raise NotSupported(mode)
        finally:
            await client.close()

    # -- seeding and counting -----------------------------------------------------------------

    async def seed(self, dsn: str, workload: str, n: int) -> int:
        client = awa.AsyncClient(dsn, max_connections=2)
        try:
            if workload == "noop":
                jobs = [Noop(i) for i in range(n)]
            elif workload == "failmix":
                jobs = [FailMix(i, i % 3) for i in range(n)]
            elif workload == "pipeline":
                jobs = [StageA(i) for i in range(n)]
            else:
                raise NotSupported(workload)
            for k in range(0, n, 10_000):
                await client.insert_many_copy(jobs[k : k + 10_000], queue=QUEUE)
        finally:
            await client.close()
        # The pipeline stages one B per pair of A's (values n // 2): 1.5 n jobs finalize.
        return n + n // 2 if workload == "pipeline" else n

    def count_query(self, workload: str) -> str:
        # The finished-row counters (done_counts: written in the statement that moves the rows,
        # so exact for what committed) instead of a count over jobs_all: that count read every
        # finished row at each poll, 12-16 ms of server CPU per poll at 40,000 rows, taken from
        # the drain it timed (pg_stat_statements, 2026-12-04).
        states = "('completed', 'failed')" if workload == "failmix" else "('completed')"
        return f"SELECT COALESCE(sum(n), 0) FROM awa_fast.done_counts WHERE state IN {states}"

    def supports(self, workload: str) -> bool:
        return True

    # -- soak (bench/soak.py) -----------------------------------------------------------------

    soak_relations = ("awa_fast", "%")  # (schema, LIKE pattern) of the tables sampled

    def soak_backlog_sql(self) -> str:
        """Unfinished jobs: one count per live state's partial index."""
        return (
            "SELECT (SELECT count(*) FROM awa_fast.jobs WHERE state = 'available')"
            " + (SELECT count(*) FROM awa_fast.jobs WHERE state = 'running')"
            " + (SELECT count(*) FROM awa_fast.jobs WHERE state IN ('scheduled', 'retryable'))"
        )

    async def open_soak_producer(self, dsn: str, lanes: int) -> SoakProducer:
        client = awa.AsyncClient(dsn, max_connections=lanes)
        await client.pool()
        return SoakProducer(client)

    # -- child side ---------------------------------------------------------------------------

    async def run_worker(
        self,
        dsn: str,
        workload: str,
        max_workers: int,
        go: asyncio.Event,
        stop: asyncio.Event,
        ready,
        options: dict | None = None,
    ) -> dict:
        """``options``: extra ``start()`` keywords (the soak's diagnosis flags)."""
        client = awa.AsyncClient(
            dsn, max_connections=int(os.environ.get("BENCH_AWA_FAST_CONNECTIONS", "10"))
        )
        snoozed: set[int] = set()

        @client.task(Noop, queue=QUEUE)
        async def noop(job):
            return None

        @client.task(FailMix, queue=QUEUE)
        async def failmix(job):
            mode = job.args.mode
            if mode == 0:
                return awa.RetryAfter(0) if job.attempt == 1 else None
            if mode == 1:
                raise awa.TerminalError("terminal")
            if job.id not in snoozed:
                snoozed.add(job.id)
                return awa.Snooze(0)
            return None

        @client.task(StageA, queue=QUEUE)
        async def stage_a(job):
            job.enqueue_on_completion(StageB(job.args.n // 2), queue=QUEUE, unique_opts={})

        @client.task(StageB, queue=QUEUE)
        async def stage_b(job):
            return None

        @client.task(SoakJob, queue=QUEUE)
        async def soak(job):
            pickup(job.args.t)

        await client.pool()
        ready()
        await go.wait()
        # BENCH_STAGED_COMPLETIONS=batched measures the opt-in batched staged path.
        await client.start(
            [(QUEUE, max_workers)],
            staged_completions=os.environ.get("BENCH_STAGED_COMPLETIONS", "per_job"),
            **(options or {}),
        )
        await stop.wait()
        stats = dict(client.runtime.finalizer.stats)
        stats["outcomes"] = dict(client.runtime.outcomes)
        await client.close()
        return stats

    async def pickup_latency(self, dsn: str, iterations: int, poll_ms: int) -> list[float]:
        client = awa.AsyncClient(dsn, max_connections=4)
        started: dict[int, float] = {}
        events: dict[int, asyncio.Event] = {}

        @client.task(Ping, queue="latency")
        async def ping(job):
            started[job.args.i] = time.perf_counter()
            events[job.args.i].set()

        await client.start([("latency", 8)], poll_interval_ms=poll_ms)
        await asyncio.sleep(0.5)
        out = []
        try:
            for i in range(iterations):
                events[i] = asyncio.Event()
                t0 = time.perf_counter()
                await client.insert(Ping(i), queue="latency")
                await asyncio.wait_for(events[i].wait(), 30)
                out.append((started[i] - t0) * 1000)
                await asyncio.sleep(0.01)
        finally:
            await client.close()
        return out
