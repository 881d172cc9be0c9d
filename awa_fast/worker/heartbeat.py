"""Batched heartbeats for a process's in-flight attempts, with pending progress piggybacked, and
a short progress-only cadence so that ``set_progress`` is visible within about half a second."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any

import psycopg

from awa_fast import bulk, pg_connection, primary
from awa_fast import pooler as pooler_mode
from awa_fast.repo.attempts import AttemptRepo
from awa_fast.retryable import Retry, classify
from awa_fast.schema_binding import DEFAULT, SchemaBinding
from awa_fast.worker.cancellation import raise_if_cancelling
from awa_fast.worker.context import JobContext
from awa_fast.worker.observe import Signal

log = logging.getLogger("awa_fast.heartbeat")

CHUNK = 500
#: Seconds between progress-only flushes (attempts whose progress changed since the last write).
PROGRESS_FLUSH_S = 0.5
#: Seconds before the first retry of a failed beat (doubling up to the interval): a lease is
#: kept by the next beat that commits, not by the next interval.
RETRY_FIRST_S = 0.25


class Heartbeat:
    """Every ``interval_s`` seconds, one guarded statement per 500 attempts refreshes
    ``heartbeat_at`` (and writes progress that changed since the last flush). Every
    ``progress_interval_s`` seconds the same statement runs for the attempts whose progress
    changed only; :attr:`progress_written` is notified after each write that carried progress.

    One bad row never fails the others: a chunk whose statement fails with anything but a lost
    connection (say a trigger rejects one row) is beaten again row by row
    (``bulk.run_isolated``); a row whose progress is refused is beaten without it and that
    progress is dropped with a warning.
    Progress counts as written only for attempts the statement returned: a row that ``SKIP
    LOCKED`` skipped (being finalized) keeps its progress pending.

    Given ``database_url`` (the runtime does), beats go over a connection of their own, opened
    on first use and again after it is lost: liveness must not wait for a pool connection, or
    handlers that hold every pool connection (``max_connections`` below the slots) would have
    their live attempts rescued as stale and run again. Without it, beats use the pool.

    Given ``round_timeout_s`` too (the runtime gives half the lease), a round over that
    connection that makes no progress for that many seconds is given up on and the connection
    dropped: the next round beats over a new one (a backend that stopped answering holds only
    the round it was given).

    The runtime runs :meth:`run` and :meth:`run_progress` on the liveness thread's own event loop
    (``worker/liveness.py``), so a handler that blocks the process's loop cannot stop them;
    ``post`` then hands :attr:`beaten` and :attr:`progress_written` notifications to the
    process's loop, and :meth:`beat` called from that loop runs the round on the liveness
    loop. ``presence`` (optional) is awaited with the beat connection after each full round
    (the process's presence row is liveness too). Each attempt the statement beat gets the
    round's ``time.monotonic()`` send time as ``beaten_mono``: its lease runs from there.
    ``pooler`` is the client's connection mode: under ``"transaction"`` the own connection
    carries no session state (no ``SET``, no prepared statements).
    """

    def __init__(
        self,
        pool_getter: Callable,
        in_flight: Callable[[], Iterable[JobContext]],
        interval_s: float,
        progress_interval_s: float = PROGRESS_FLUSH_S,
        *,
        database_url: str | None = None,
        presence: Callable[[Any], Awaitable[None]] | None = None,
        pooler: str | None = None,
        round_timeout_s: float | None = None,
        binding: SchemaBinding = DEFAULT,
    ):
        self._pool_getter = pool_getter
        self._connection_class = pg_connection.connection_class(binding)
        self.round_timeout_s = round_timeout_s
        self.rounds_abandoned = 0
        self._stepped = 0.0  # time.monotonic() the current round last made progress
        self._presence = presence
        self._post: Callable[[Callable[[], Any]], Any] = _call
        self._home: asyncio.AbstractEventLoop | None = None  # where the beat loops run

        self._database_url = database_url
        self._wants_primary = database_url is not None and primary.wants_primary(database_url)
        self._pooler = pooler  # the connection mode (awa_fast.pooler): no session SET behind one
        # an attempt whose beat a trigger refuses meets every beat: warned about once
        self._recurring = bulk.Recurring()
        self._conn: psycopg.AsyncConnection | None = None
        self._conn_lock = asyncio.Lock()
        self._holder: asyncio.Task | None = None  # the round using the connection
        self._abandoned: set[asyncio.Future] = set()  # rounds given up on, still ending
        self._in_flight = in_flight
        self.interval_s = interval_s
        self.progress_interval_s = progress_interval_s
        self.beats = 0
        self.progress_dropped = 0
        self.progress_written = asyncio.Condition()
        # fired after each round of beats that wrote (value: progress_only)
        self.beaten = Signal("heartbeat")

    async def run(self) -> None:
        await self._every(self.interval_s, progress_only=False, what="heartbeat")

    async def run_progress(self) -> None:
        await self._every(self.progress_interval_s, progress_only=True, what="progress flush")

    def host(self, loop: asyncio.AbstractEventLoop, post: Callable[[Callable[[], Any]], Any]):
        """Run on ``loop`` (another thread's), handing notifications over with ``post``
        (``call_soon_threadsafe`` of the process's loop)."""
        self._home, self._post = loop, post

    async def _every(self, interval_s: float, *, progress_only: bool, what: str) -> None:
        delay = interval_s
        while True:
            await asyncio.sleep(delay)
            # Rounds are sent every interval_s (a failed one retried sooner), counted from the
            # previous round's send however long it took: a lease runs from a beat's send
            # (worker/liveness.py), and sleeping a full interval after a slow or given-up round
            # would let two slow rounds cost a healthy attempt its lease, where a rescuer
            # (commit to commit) would still leave it alone.
            started = time.monotonic()
            try:
                await self._bounded_round(progress_only)
            except (psycopg.Error, OSError, TimeoutError) as exc:
                log.warning("%s failed: %s", what, exc)
                period = self._retry_after(interval_s)
            except Exception:  # never let one beat end the loop
                log.exception("%s failed", what)
                period = self._retry_after(interval_s)
            else:
                self._failures = 0
                period = interval_s
            delay = max(0.0, period - (time.monotonic() - started))
            raise_if_cancelling()  # see worker/cancellation.py

    _failures = 0

    async def _bounded_round(self, progress_only: bool) -> None:
        # A round that has made no progress (connected, or a statement ended) for
        # ``round_timeout_s`` (its connection's backend stopped answering, a half-open TCP
        # connection) is left to end on its own: its
        # connection is dropped, so the next round beats over a new one before the lease runs
        # out. Waiting for it (or cancelling it: psycopg then waits up to 10 s for the backend)
        # would hold every later round, and cost every later attempt its lease.
        if self.round_timeout_s is None or self._database_url is None:
            await self._beat(progress_only)
            return
        self._stepped = time.monotonic()
        task = asyncio.ensure_future(self._beat(progress_only))
        try:
            while True:  # a round of many chunks may take long: given up on without progress
                left = self.round_timeout_s - (time.monotonic() - self._stepped)
                if left <= 0:
                    break
                done, _ = await asyncio.wait({task}, timeout=left)
                if done:
                    task.result()
                    return
        except asyncio.CancelledError:
            task.cancel()
            raise
        task.add_done_callback(_retrieve)
        task.cancel()  # it ends (closing its connection) when psycopg's cancel gives up
        self._abandoned.add(task)
        task.add_done_callback(self._abandoned.discard)
        if self._holder is task:  # (not when it only waited for the connection's lock)
            self.rounds_abandoned += 1
            self._conn, self._conn_lock = None, asyncio.Lock()  # the next round connects afresh
            self._holder = None
        raise TimeoutError(
            f"no answer within {self.round_timeout_s:g} s; beating over a new connection"
        )

    def _retry_after(self, interval_s: float) -> float:
        self._failures += 1
        return min(interval_s, RETRY_FIRST_S * 2 ** (self._failures - 1))

    async def beat(self, progress_only: bool = False) -> None:
        """Send one round of heartbeats now (only for attempts with unwritten progress when
        ``progress_only``), on the loop the beats run on (awaited from any loop).

        Raises:
            psycopg.Error, OSError: the round failed (the loops log it and retry).
        """
        home = self._home
        if home is None or home is asyncio.get_running_loop():
            await self._beat(progress_only)
            return
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._beat(progress_only), home))

    async def _beat(self, progress_only: bool) -> None:
        ctxs = sorted(self._in_flight(), key=lambda c: (c.id, c.run_lease))
        if progress_only:
            ctxs = [c for c in ctxs if c.progress_snapshot() is not None]
        if not ctxs:
            if not progress_only:
                if self._presence is not None:
                    async with self._connection() as conn:
                        await self._presence(conn)
            return
        wrote_progress = False
        async with self._connection() as conn:
            for start in range(0, len(ctxs), CHUNK):
                chunk = ctxs[start : start + CHUNK]
                snaps = [c.progress_snapshot() for c in chunk]
                sent = time.monotonic()
                beaten = await self._beat_chunk(conn, chunk, snaps)
                self._stepped = time.monotonic()
                for c, s in zip(chunk, snaps):
                    if (c.id, c.run_lease) in beaten:
                        # its lease runs from its chunk's send (worker/liveness.py)
                        c.beaten_mono = sent
                        if s is not None:
                            generation, _ = s
                            c.progress_acked(generation)
                            wrote_progress = True
            if not progress_only:  # every attempt was met: the pass is complete
                self._recurring.pass_done()
                # An attempt whose job was dead-lettered while its handler runs (an early
                # fail_external) keeps its mark fresh on the DLQ entry.
                await AttemptRepo(conn).beat_dlq_marks(
                    [c.id for c in ctxs], [c.run_lease for c in ctxs]
                )
                if self._presence is not None:
                    await self._presence(conn)
        if not progress_only:
            self.beats += 1
        self._post(lambda: self._fired(progress_only, wrote_progress))

    def _fired(self, progress_only: bool, wrote_progress: bool) -> None:
        # On the process's loop: the signal's waiters and the condition belong to it.
        self.beaten.fire(progress_only)
        if wrote_progress:  # waiters re-check their own condition
            asyncio.get_running_loop().create_task(self._notify_progress())

    async def _notify_progress(self) -> None:
        async with self.progress_written:
            self.progress_written.notify_all()

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[psycopg.AsyncConnection]:
        if self._database_url is None:
            async with (await self._pool_getter()).connection() as conn:
                yield conn
            return
        async with self._conn_lock:  # the beat and progress loops share the connection
            self._holder = asyncio.current_task()
            conn = self._conn
            if conn is None or conn.closed:
                conn = await self._connection_class.connect(
                    self._database_url,
                    autocommit=True,
                    connect_timeout=10,
                    **pooler_mode.connect_options(self._pooler),
                )
                if pooler_mode.session_state_allowed(self._pooler):
                    # it moves finished rows (through a transaction pooler the database's
                    # default is READ COMMITTED: pooler.check_connection)
                    try:
                        await AttemptRepo(conn).read_committed()
                    except BaseException:
                        await _close(conn)
                        raise
                self._conn = conn
                self._stepped = time.monotonic()
            try:
                yield conn
            except BaseException as exc:
                # A connection that may be lost is replaced at the next beat; so is one a round
                # was abandoned on (_bounded_round), which this round may no longer use.
                lost = isinstance(exc, Exception) and classify(exc) is Retry.TRANSIENT
                if lost or self._conn is not conn:
                    if self._conn is conn:
                        self._conn = None
                    await _close(conn)
                raise
            else:
                if self._conn is not conn:  # abandoned as it ended: nobody else has it
                    await _close(conn)
                elif conn is not None and self._wants_primary and primary.server_read_only(conn):
                    # its server takes writes no more (a switchover): the next beat's
                    # connection is chosen by libpq again (awa_fast/primary.py)
                    self._conn = None
                    await _close(conn)
            finally:
                if self._holder is asyncio.current_task():
                    self._holder = None

    async def close(self) -> None:
        """Close the heartbeat's own connection (if any), on the loop the beats run on."""
        conn, self._conn = self._conn, None
        if conn is not None:
            await _close(conn)
        if self._abandoned:  # cancelled again, psycopg closes their connections at once
            for task in self._abandoned:
                task.cancel()
            await asyncio.wait(set(self._abandoned), timeout=1.0)

    async def _beat_chunk(self, conn, chunk: list[JobContext], snaps: list) -> set[tuple]:
        # One statement per chunk (bulk.run_isolated): a row that makes it fail is beaten
        # alone; if that fails too, without its progress (dropped, counted, logged); if even
        # that fails it is skipped this round (logged). Returns the (id, lease) beaten.
        progress = {(c.id, c.run_lease): _text(s) for c, s in zip(chunk, snaps)}
        kinds = {(c.id, c.run_lease): c.kind for c in chunk}
        dropped: set[tuple] = set()
        repo = AttemptRepo(conn)

        async def beat(attempts: list[tuple], with_progress: bool = True) -> list[tuple]:
            return await repo.beat(
                [job_id for job_id, _ in attempts],
                [lease for _, lease in attempts],
                [progress[a] if with_progress else None for a in attempts],
            )

        async def without_progress(attempt: tuple, exc: Exception) -> None:
            job_id, _ = attempt
            bulk.warn_row(
                self._recurring,
                log,
                ("beat", attempt),
                bulk.error_signature(exc),
                "heartbeat of job %s (%s) failed: %s",
                job_id,
                kinds[attempt],
                exc,
            )
            if progress[attempt] is not None and await beat([attempt], with_progress=False):
                dropped.add(attempt)
                self.progress_dropped += 1
                log.warning(
                    "progress of job %s (%s) cannot be stored; dropped", job_id, kinds[attempt]
                )

        attempts = list(progress)
        done = await bulk.run_isolated(
            conn,
            what="heartbeat",
            bulk=lambda: beat(attempts),
            keys=attempts,
            one=lambda a: beat([a]),
            on_error=without_progress,
            recurring=self._recurring,
            ends_pass=False,  # a beat is one pass over all its chunks (beat())
        )
        return set(done.rows) | dropped


def _text(snapshot: tuple[int, str] | None) -> str | None:
    # a progress snapshot (generation, JSON text): the text the beat writes
    if snapshot is None:
        return None
    _, text = snapshot
    return text


def _call(fn: Callable[[], Any]) -> None:
    fn()


async def _close(conn: psycopg.AsyncConnection) -> None:
    with contextlib.suppress(Exception):  # closing a dead connection may fail
        await conn.close()


def _retrieve(task: asyncio.Future) -> None:
    # An abandoned round's end (an error, a cancel) was reported when it was abandoned.
    if not task.cancelled():
        task.exception()
