"""awa-pg adapter (module ``awa``).

Default behaviour, as a fresh deployment sees it: ``awa.migrate`` leaves the canonical engine;
the first ``start()`` on an empty database switches to queue storage (reference §2.1). The
adapter's ``setup`` does exactly that (migrate, start a runtime once on the empty database, shut
it down), so every scenario runs on queue storage, awa-pg's default and fastest engine. The
engine actually in use is recorded in each JSONL record.

Pipeline: awa-pg 0.6.9 has no handler-staged follow-ups, so the stage-A handler inserts its
stage-B job itself (``insert(..., unique_opts={})`` through the worker's client, not atomic
with A's completion; a conflict means the other A of the pair was first).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time

import psycopg

from bench.soak import pickup
from bench.systems import NotSupported, dist_version

QUEUE = "bench"


@dataclasses.dataclass
class Noop:
    n: int


@dataclasses.dataclass
class FailMix:
    n: int
    mode: int


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

    def __init__(self, client):
        self.client = client

    async def insert(self, n: int, t: float) -> None:
        await self.client.enqueue_many_copy([SoakJob(t)] * n, queue=QUEUE)

    async def close(self) -> None:
        await self.client.close()


class Adapter:
    name = "awa_pg"
    dist = "awa-pg"

    def __init__(self):
        import awa  # noqa: F401  (ImportError = not available)

        self.version = dist_version(self.dist)
        self._engine: dict[str, str] = {}

    def _client(self, dsn: str, max_connections: int = 10):
        import awa

        return awa.AsyncClient(dsn, max_connections=max_connections)

    async def setup(self, dsn: str) -> dict:
        import awa

        await awa.migrate(dsn)
        client = self._client(dsn, 4)

        @client.task(Noop, queue=QUEUE)
        async def noop(job):
            return None

        await client.start([(QUEUE, 8)])
        await asyncio.sleep(0.3)
        await client.shutdown()
        await client.close()
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute(
                "SELECT current_engine, state FROM awa.storage_transition_state"
            ).fetchone()
        engine = f"{row[0]}/{row[1]}" if row else "unknown"
        self._engine[dsn] = engine
        return {"engine": engine}

    def _queue_storage(self, dsn: str) -> bool:
        return self._engine.get(dsn, "queue_storage").startswith("queue_storage")

    async def enqueue(self, dsn: str, mode: str, n: int, batch: int) -> dict:
        client = self._client(dsn, 4)
        try:
            if mode == "single":
                t = time.perf_counter()
                for i in range(n):
                    await client.insert(Noop(i), queue=QUEUE)
                return {"elapsed": time.perf_counter() - t, "method": "AsyncClient.insert"}
            if mode == "many":
                jobs = [Noop(i) for i in range(n)]
                t = time.perf_counter()
                for k in range(0, n, batch):
                    tx = await client.transaction()
                    await tx.insert_many(jobs[k : k + batch], queue=QUEUE)
                    await tx.commit()
                return {
                    "elapsed": time.perf_counter() - t,
                    "method": f"Transaction.insert_many (batches of {batch})",
                }
            if mode == "copy":
                # The target names insert_many_copy (the compat COPY); enqueue_many_copy (direct
                # queue-storage COPY) is measured too and kept in "alternatives_per_s".
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
                results = {}
                for off, method in enumerate(("insert_many_copy", "enqueue_many_copy")):
                    jobs = [Noop(off * n + i) for i in range(n)]
                    t = time.perf_counter()
                    try:
                        await getattr(client, method)(jobs, queue=QUEUE, unique_opts={})
                    except Exception as exc:
                        results[method] = None
                        print(f"  awa_pg {method} unique failed: {exc}")
                        continue
                    results[method] = time.perf_counter() - t
                ok = {k: v for k, v in results.items() if v}
                best = min(ok, key=ok.get)
                return {
                    "elapsed": ok[best],
                    "method": f"{best}, unique_opts={{}}",
                    "alternatives_per_s": {
                        k: (round(n / v, 1) if v else None) for k, v in results.items()
                    },
                }
            raise NotSupported(mode)
        finally:
            await client.close()

    async def seed(self, dsn: str, workload: str, n: int) -> int:
        if workload == "noop":
            jobs = [Noop(i) for i in range(n)]
        elif workload == "failmix":
            jobs = [FailMix(i, i % 3) for i in range(n)]
        elif workload == "pipeline":
            jobs = [StageA(i) for i in range(n)]
        else:
            raise NotSupported(workload)
        client = self._client(dsn, 2)
        try:
            method = (
                client.enqueue_many_copy if self._queue_storage(dsn) else client.insert_many_copy
            )
            for k in range(0, n, 10_000):
                await method(jobs[k : k + 10_000], queue=QUEUE)
        finally:
            await client.close()
        return n + n // 2 if workload == "pipeline" else n

    pipeline_method = (
        "A's handler inserts B itself (unique_opts={}; not atomic with A's completion)"
    )

    def supports(self, workload: str) -> bool:
        # no handler-staged follow-ups in awa-pg 0.6.9: the pipeline inserts from the handler
        return workload in ("noop", "failmix", "soak", "pipeline")

    # -- soak (bench/soak.py) -----------------------------------------------------------------

    soak_relations = ("awa", "%")

    def soak_backlog_sql(self) -> None:
        """None: queue storage has no cheap count of unfinished jobs (ready entries stay until
        their ring segment is pruned; ``queue_stats`` took seconds here), so the soak counts
        the backlog worker-side (produced - picked)."""
        return None

    async def open_soak_producer(self, dsn: str, lanes: int) -> SoakProducer:
        return SoakProducer(self._client(dsn, lanes))

    def count_query(self, workload: str) -> str:
        # The views (awa.jobs, awa.terminal_jobs) take seconds to count on queue storage; count
        # the storage tables directly: compact completions are batch rows with completed_count,
        # every other terminal outcome is a done_entries row.
        states = "('completed', 'failed')" if workload == "failmix" else "('completed')"
        return (
            "SELECT (SELECT COALESCE(sum(completed_count), 0) FROM awa.receipt_completion_batches)"
            f" + (SELECT count(*) FROM awa.done_entries WHERE state::text IN {states})"
        )

    async def run_worker(self, dsn, workload, max_workers, go, stop, ready, options=None) -> dict:
        import awa

        if options:
            raise NotSupported(f"start options {sorted(options)} (awa-fast only)")

        client = self._client(dsn, 10)
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

        @client.task(SoakJob, queue=QUEUE)
        async def soak(job):
            pickup(job.args.t)

        @client.task(StageA, queue=QUEUE)
        async def stage_a(job):
            try:
                await client.insert(StageB(job.args.n // 2), queue=QUEUE, unique_opts={})
            except awa.UniqueConflict:
                pass

        @client.task(StageB, queue=QUEUE)
        async def stage_b(job):
            return None

        ready()
        await go.wait()
        await client.start([(QUEUE, max_workers)])
        await stop.wait()
        await client.shutdown()
        await client.close()
        return {}

    async def pickup_latency(self, dsn: str, iterations: int, poll_ms: int) -> list[float]:
        # max_connections 10 (awa's default): with 4 the runtime's own connections starve the
        # producer's insert ("pool timed out").
        client = self._client(dsn, 10)
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
            await client.shutdown()
            await client.close()
        return out
