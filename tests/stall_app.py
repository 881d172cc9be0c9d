"""The application of the stalled-loop tests (tests/runtime/test_stalled_loop.py), in-process or run by
``awa-fast worker tests.stall_app:client``.

``$AWA_FAST_LAUNCHER_DSN``: the database; ``$AWA_FAST_STALL_LOG``: a file each execution appends
``<job id> <attempt> <pid> start|end|cancelled <time.time()>`` to (one ``write`` on an ``O_APPEND`` file
per line, so processes never interleave inside a line). Kinds, all in queue ``stall``:

- ``Block(seconds)``: an ``async def`` handler that blocks its event loop (``time.sleep``);
- ``Await(seconds)``: an ``async def`` handler that only awaits;
- ``Work(seconds)``: a ``def`` handler (a thread of the pool).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import time

import psycopg

import awa_fast as awa

QUEUE = "stall"
client = awa.AsyncClient(os.environ.get("AWA_FAST_LAUNCHER_DSN", ""))

# Heartbeats every 500 ms, judged stale after 1 s, rescue and leader checks every 50-100 ms:
# a block of a few seconds spans many heartbeat periods and rescue passes.
START_OPTIONS = dict(
    poll_interval_ms=50,
    heartbeat_interval_ms=500,
    heartbeat_staleness_ms=1000,
    heartbeat_rescue_interval_ms=50,
    deadline_rescue_interval_ms=50,
    promote_interval_ms=50,
    leader_election_interval_ms=100,
)


@dataclasses.dataclass
class Block:
    seconds: float


@dataclasses.dataclass
class Await:
    seconds: float


@dataclasses.dataclass
class Work:
    seconds: float


def record(job, what: str) -> None:
    line = f"{job.id} {job.attempt} {os.getpid()} {what} {time.time():.6f}\n"
    fd = os.open(os.environ["AWA_FAST_STALL_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


async def block(job):
    record(job, "start")
    time.sleep(job.args.seconds)  # blocks the event loop on purpose
    record(job, "end")


async def wait(job):
    record(job, "start")
    try:
        await asyncio.sleep(job.args.seconds)
    except asyncio.CancelledError:
        record(job, "cancelled")
        raise
    record(job, "end")


def work(job):
    record(job, "start")
    time.sleep(job.args.seconds)
    record(job, "end")


def recording(on: awa.AsyncClient, args_type: type, queue: str) -> list[tuple[int, str]]:
    """Register on ``on`` an ``async def`` handler of ``args_type`` (a ``seconds`` field) that
    awaits that long; returns the list it appends ``(attempt, "start"|"cancelled"|"end")`` to."""
    runs: list[tuple[int, str]] = []

    @on.task(args_type, queue=queue)
    async def run(job):
        runs.append((job.attempt, "start"))
        try:
            await asyncio.sleep(job.args.seconds)
        except asyncio.CancelledError:
            runs.append((job.attempt, "cancelled"))
            raise
        runs.append((job.attempt, "end"))

    return runs


@contextlib.contextmanager
def slow_beats(dsn: str, seconds: float):
    """A real trigger that makes every heartbeat of a running row take ``seconds`` in the
    server, while the block lasts."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            f"""CREATE FUNCTION slow_beat() RETURNS trigger LANGUAGE plpgsql AS $$
               BEGIN PERFORM pg_sleep({float(seconds)}); RETURN NEW; END $$;
               CREATE TRIGGER slow_beat BEFORE UPDATE ON awa_fast.jobs FOR EACH ROW
               WHEN (OLD.state = 'running' AND NEW.state = 'running'
                     AND NEW.heartbeat_at IS DISTINCT FROM OLD.heartbeat_at)
               EXECUTE FUNCTION slow_beat()"""
        )
    try:
        yield
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("DROP TRIGGER slow_beat ON awa_fast.jobs; DROP FUNCTION slow_beat()")


def register(on: awa.AsyncClient) -> None:
    """Register the three handlers on ``on``."""
    on.task(Block, queue=QUEUE)(block)
    on.task(Await, queue=QUEUE)(wait)
    on.task(Work, queue=QUEUE)(work)


register(client)


def executions(path: str) -> dict[int, list[tuple[int, int, float, float | None]]]:
    """``{job id: [(attempt, pid, started, ended or None)]}`` from the log at ``path``."""
    runs: dict[tuple[int, int, int], list] = {}
    with open(path) as f:
        for line in f:
            job_id, attempt, pid, what, at = line.split()
            key = (int(job_id), int(attempt), int(pid))
            run = runs.setdefault(key, [None, None])
            if what != "cancelled":  # a cancelled execution did not end its work
                run[0 if what == "start" else 1] = float(at)
    out: dict[int, list] = {}
    for (job_id, attempt, pid), (started, ended) in sorted(runs.items()):
        out.setdefault(job_id, []).append((attempt, pid, started, ended))
    return out


def lines(path: str) -> list[tuple[int, int, int, str, float]]:
    """Every line of the log at ``path`` as ``(job id, attempt, pid, what, time)``."""
    with open(path) as f:
        return [(int(a), int(b), int(c), d, float(e)) for a, b, c, d, e in (ln.split() for ln in f)]


def overlaps(runs: list[tuple[int, int, float, float | None]]) -> list[tuple]:
    """Pairs of executions of one job that ran at the same time (an unended one runs on)."""
    found = []
    for i, a in enumerate(runs):
        for b in runs[i + 1 :]:
            a_end = a[3] if a[3] is not None else float("inf")
            b_end = b[3] if b[3] is not None else float("inf")
            if a[2] < b_end and b[2] < a_end:
                found.append((a, b))
    return found
