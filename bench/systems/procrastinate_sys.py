"""procrastinate adapter.

Configuration from procrastinate's docs: ``PsycopgConnector`` (psycopg 3 pool), a worker with
``concurrency`` > 1 for async tasks, LISTEN/NOTIFY on (default). Bulk enqueue is
``Task.batch_defer_async`` (one call); there is no COPY path. Uniqueness is the
``queueing_lock`` option, which ``configure()`` applies to a whole batch, so unique enqueue
defers one job per call. No snooze: the failure mix retries once (``RetryStrategy``) for both
"retry" and "snooze", and fails terminally with a non-retried exception.

Pipeline (the nearest thing to awa-fast's staged follow-ups, not atomic): the stage-A task
defers its stage-B job itself with ``queueing_lock`` (one todo job per B value; a B value whose
first job already started is deferred again). Counted: stage-A jobs succeeded plus distinct B
values succeeded.
"""

from __future__ import annotations

import asyncio
import time

from bench.soak import pickup
from bench.systems import NotSupported, dist_version

QUEUE = "bench"
CONCURRENCY = 50


class RetryOnce(Exception):
    pass


def _make_app(dsn: str, max_size: int = 20):
    import procrastinate
    from procrastinate import App, PsycopgConnector, RetryStrategy

    app = App(connector=PsycopgConnector(conninfo=dsn, min_size=1, max_size=max_size))
    retry = RetryStrategy(max_attempts=1, wait=0, retry_exceptions={RetryOnce})
    state = {"started": {}, "events": {}}

    @app.task(name="noop", queue=QUEUE)
    async def noop(n):
        return None

    @app.task(name="failmix", queue=QUEUE, retry=retry, pass_context=True)
    async def failmix(context, n, mode):
        if mode == 1:
            raise RuntimeError("terminal")
        if context.job.attempts == 0:
            raise RetryOnce()

    @app.task(name="ping", queue="latency")
    async def ping(i):
        state["started"][i] = time.perf_counter()
        state["events"][i].set()

    @app.task(name="soak", queue=QUEUE)
    async def soak(t):
        pickup(t)

    @app.task(name="stage_b", queue=QUEUE)
    async def stage_b(v):
        return None

    @app.task(name="stage_a", queue=QUEUE)
    async def stage_a(n):
        v = n // 2
        try:
            await stage_b.configure(queueing_lock=f"b{v}").defer_async(v=v)
        except procrastinate.exceptions.AlreadyEnqueued:
            pass

    _ = procrastinate
    tasks = {"noop": noop, "failmix": failmix, "ping": ping, "soak": soak, "stage_a": stage_a}
    return app, tasks, state


class SoakProducer:
    method = "batch_defer_async (one call per tick)"

    def __init__(self, app, task, opened):
        self.app, self.task, self.opened = app, task, opened

    async def insert(self, n: int, t: float) -> None:
        await self.task.batch_defer_async(*({"t": t} for _ in range(n)))

    async def close(self) -> None:
        await self.opened.__aexit__(None, None, None)


class Adapter:
    name = "procrastinate"
    dist = "procrastinate"

    def __init__(self):
        import procrastinate  # noqa: F401

        self.version = dist_version(self.dist)

    async def setup(self, dsn: str) -> dict:
        app, _, _ = _make_app(dsn)
        async with app.open_async():
            await app.schema_manager.apply_schema_async()
        return {"engine": "PsycopgConnector"}

    async def enqueue(self, dsn: str, mode: str, n: int, batch: int) -> dict:
        app, tasks, _ = _make_app(dsn)
        noop = tasks["noop"]
        async with app.open_async():
            if mode == "single":
                t = time.perf_counter()
                for i in range(n):
                    await noop.defer_async(n=i)
                return {"elapsed": time.perf_counter() - t, "method": "Task.defer_async"}
            if mode in ("many", "copy"):
                step = batch if mode == "many" else n
                t = time.perf_counter()
                for k in range(0, n, step):
                    await noop.batch_defer_async(*({"n": i} for i in range(k, min(n, k + step))))
                label = (
                    f"batch_defer_async (batches of {step})"
                    if mode == "many"
                    else "batch_defer_async, one call (no COPY path)"
                )
                return {"elapsed": time.perf_counter() - t, "method": label}
            if mode == "unique":
                t = time.perf_counter()
                for i in range(n):
                    await noop.configure(queueing_lock=f"u{i}").defer_async(n=i)
                return {
                    "elapsed": time.perf_counter() - t,
                    "method": "configure(queueing_lock=...).defer_async, one per call",
                }
        raise NotSupported(mode)

    async def seed(self, dsn: str, workload: str, n: int) -> int:
        app, tasks, _ = _make_app(dsn)
        async with app.open_async():
            for k in range(0, n, 5000):
                idx = range(k, min(n, k + 5000))
                if workload == "noop":
                    await tasks["noop"].batch_defer_async(*({"n": i} for i in idx))
                elif workload == "failmix":
                    await tasks["failmix"].batch_defer_async(
                        *({"n": i, "mode": i % 3} for i in idx)
                    )
                elif workload == "pipeline":
                    await tasks["stage_a"].batch_defer_async(*({"n": i} for i in idx))
                else:
                    raise NotSupported(workload)
        return n + n // 2 if workload == "pipeline" else n

    pipeline_method = "A's task defers B itself (queueing_lock; not atomic with A's completion)"

    def supports(self, workload: str) -> bool:
        return workload in ("noop", "failmix", "soak", "pipeline")

    # -- soak (bench/soak.py) -----------------------------------------------------------------

    soak_relations = ("public", "procrastinate%")

    def soak_backlog_sql(self) -> str:
        return "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')"

    async def open_soak_producer(self, dsn: str, lanes: int) -> SoakProducer:
        app, tasks, _ = _make_app(dsn, max_size=lanes)
        opened = app.open_async()
        await opened.__aenter__()
        return SoakProducer(app, tasks["soak"], opened)

    def count_query(self, workload: str) -> str:
        if workload == "pipeline":
            return (
                "SELECT count(*) FILTER (WHERE task_name = 'stage_a')"
                " + count(DISTINCT args->>'v') FILTER (WHERE task_name = 'stage_b')"
                " FROM procrastinate_jobs WHERE status::text = 'succeeded'"
            )
        states = "('succeeded', 'failed')" if workload == "failmix" else "('succeeded')"
        return f"SELECT count(*) FROM procrastinate_jobs WHERE status::text IN {states}"

    async def run_worker(self, dsn, workload, max_workers, go, stop, ready, options=None) -> dict:
        if options:
            raise NotSupported(f"start options {sorted(options)} (awa-fast only)")
        app, _, _ = _make_app(dsn)
        async with app.open_async():
            ready()
            await go.wait()
            task = asyncio.create_task(
                app.run_worker_async(
                    queues=[QUEUE],
                    concurrency=min(max_workers, CONCURRENCY),
                    wait=True,
                    install_signal_handlers=False,
                    delete_jobs="never",
                )
            )
            await stop.wait()
            task.cancel()
            try:
                await asyncio.wait_for(task, 10)
            except BaseException:
                pass
        return {}

    async def pickup_latency(self, dsn: str, iterations: int, poll_ms: int) -> list[float]:
        app, tasks, state = _make_app(dsn)
        out = []
        async with app.open_async():
            task = asyncio.create_task(
                app.run_worker_async(
                    queues=["latency"],
                    concurrency=8,
                    wait=True,
                    install_signal_handlers=False,
                    fetch_job_polling_interval=poll_ms / 1000,
                    listen_notify=True,
                )
            )
            await asyncio.sleep(0.5)
            try:
                for i in range(iterations):
                    state["events"][i] = asyncio.Event()
                    t0 = time.perf_counter()
                    await tasks["ping"].defer_async(i=i)
                    await asyncio.wait_for(state["events"][i].wait(), 30)
                    out.append((state["started"][i] - t0) * 1000)
                    await asyncio.sleep(0.01)
            finally:
                task.cancel()
                try:
                    await asyncio.wait_for(task, 10)
                except BaseException:
                    pass
        return out
