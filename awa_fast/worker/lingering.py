"""Attempts whose ``def`` handler thread outlives its task: abandoned at its deadline, or still
running when shutdown stopped waiting for it. A thread cannot be stopped, so until it ends the
attempt keeps its "still running" mark fresh (``sql.HEARTBEAT``: the ``running`` row, or the
mark a deadline rescue left on the rescued row or its DLQ entry), and promotion, rescue and
retries wait for it (docs/architecture.md, "No two executions of one job overlap").

The beats and the attempt's last statements run on a thread with a connection of its own:
they go on after ``shutdown()`` closed the pool, and the interpreter's exit waits for them (it
waits for the handler threads anyway; at exit, a database that does not answer is given up on
after ``EXIT_TRIES`` tries). If the process dies first, the mark goes stale after the
process's ``min_stale_ms`` and rescue takes over.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Any

import psycopg

from awa_fast import pooler as pooler_mode
from awa_fast.pg_connection import sync_connection_class
from awa_fast.repo.attempts import BlockingAttemptRepo
from awa_fast.schema_binding import DEFAULT, SchemaBinding

log = logging.getLogger("awa_fast.lingering")

EXIT_TRIES = 3  # at interpreter exit, tries to write the ended attempts before giving up


@dataclasses.dataclass
class _Attempt:
    job_id: int
    run_lease: int
    queue: str
    future: Any  # the handler's concurrent.futures.Future
    release: bool  # give the attempt back to 'available' (uncounted) when the thread ends
    progress: str | None  # its last progress (JSON text), written with the release


class Lingering:
    """Keeps the marks of attempts whose handler thread outlives its task fresh every
    ``interval_s`` seconds (the heartbeat interval) and, once a thread has finished, clears its
    mark (``BlockingAttemptRepo.ack_ended``) -- after giving the attempt back to ``available`` when it
    was still ``running`` at shutdown (``release``). A statement that fails is retried at the
    next beat (logged).

    Args:
        database_url: where to connect (the lingering thread's own connection).
        interval_s: seconds between beats.
    """

    def __init__(
        self,
        database_url: str,
        interval_s: float,
        pooler: str | None = None,
        binding: SchemaBinding = DEFAULT,
    ):
        self.database_url = database_url
        self.pooler = pooler  # the connection mode (awa_fast.pooler): no session SET behind one
        self._connect = sync_connection_class(binding).connect  # its schema (ADR 027)
        self.interval_s = interval_s
        self.ended = 0  # attempts whose thread finished and whose last statements committed
        self._attempts: dict[tuple[int, int], _Attempt] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        # (instance, ttl_ms) of the process's presence row once shutdown handed it over: kept
        # fresh with every beat and deleted when the last watched thread ends (ADR 020)
        self._presence: tuple[str, float] | None = None

    @property
    def pending(self) -> int:
        """Attempts still watched (their thread runs, or their last statement is pending)."""
        with self._lock:
            return len(self._attempts)

    def running_job_ids(self) -> list[int]:
        """Job ids of the watched attempts whose handler thread still runs."""
        with self._lock:
            return sorted(a.job_id for a in self._attempts.values() if not a.future.done())

    def watch(self, ctx: Any, *, release: bool) -> None:
        """Watch ``ctx``'s attempt (a :class:`JobContext` whose ``thread`` still runs)."""
        snap = ctx.progress_snapshot()
        progress = None
        if snap is not None:
            _, progress = snap
        attempt = _Attempt(ctx.id, ctx.run_lease, ctx.queue, ctx.thread, release, progress)
        with self._lock:
            self._attempts[(ctx.id, ctx.run_lease)] = attempt
            if self._thread is None:
                # Not a daemon: at interpreter exit it is joined after the handler threads
                # (which the executor's exit hook joins first), so it still gives their
                # attempts back and removes the presence row (a daemon was killed first).
                self._thread = threading.Thread(
                    target=self._run, name="awa-fast-lingering", daemon=False
                )
                self._thread.start()
        ctx.thread.add_done_callback(lambda _f: self._wake.set())
        self._wake.set()

    def keep_presence(self, instance: str, ttl_ms: float) -> bool:
        """Take over the process's presence row at shutdown: refresh it with each beat and
        delete it once no watched attempt is left. Returns False (nothing taken over: the
        caller deletes the row) when no attempt is watched."""
        with self._lock:
            if not self._attempts:
                return False
            self._presence = (instance, ttl_ms)
        self._wake.set()
        return True

    def wait_ended(self, n: int, timeout: float | None = None) -> bool:
        """Block until ``n`` watched attempts have ended (a signal for tests); False on timeout."""
        with self._changed:
            return self._changed.wait_for(lambda: self.ended >= n, timeout)

    @staticmethod
    def _exiting_with_only_ended(attempts: list[_Attempt]) -> bool:
        """The interpreter is exiting (its main thread ended) and every watched thread has
        ended: only their last statements are left to write."""
        return not threading.main_thread().is_alive() and all(a.future.done() for a in attempts)

    def _run(self) -> None:
        conn: psycopg.Connection | None = None
        failures_at_exit = 0
        try:
            while True:
                self._wake.clear()
                with self._lock:
                    if not self._attempts:
                        self._thread = None
                        presence, self._presence = self._presence, None
                        break
                    attempts = list(self._attempts.values())
                try:
                    if conn is None or conn.closed:
                        conn = self._connect(
                            self.database_url,
                            autocommit=True,
                            connect_timeout=10,
                            **pooler_mode.connect_options(self.pooler),
                        )
                        if pooler_mode.session_state_allowed(self.pooler):
                            BlockingAttemptRepo(conn).read_committed()  # it moves finished rows
                    self._beat(conn, [a for a in attempts if not a.future.done()])
                    for a in attempts:
                        if a.future.done():
                            self._end(conn, a)
                except Exception as exc:  # retried at the next beat
                    log.warning("lingering attempts: %s: %s", type(exc).__name__, exc)
                    if conn is not None:
                        conn.close()
                    conn = None
                    if self._exiting_with_only_ended(attempts):
                        failures_at_exit += 1
                        if failures_at_exit >= EXIT_TRIES:
                            # the interpreter waits for this thread: never forever
                            log.error(
                                "giving up on %d lingering attempt(s) at exit (the database "
                                "did not answer): heartbeat rescue takes them",
                                len(attempts),
                            )
                            with self._lock:
                                self._attempts.clear()
                                self._thread = None
                                self._presence = None
                            return
                if self.pending:  # else back to the top at once: the thread ends there
                    self._wake.wait(self.interval_s)
            if presence is not None:
                instance, _ = presence
                self._leave(conn, instance)
        finally:
            if conn is not None:
                conn.close()

    def _leave(self, conn: psycopg.Connection | None, instance: str) -> None:
        try:
            if conn is not None and not conn.closed:
                BlockingAttemptRepo(conn).gone(instance)
                return
            with self._connect(
                self.database_url,
                autocommit=True,
                connect_timeout=10,
                **pooler_mode.connect_options(self.pooler),
            ) as own:
                BlockingAttemptRepo(own).gone(instance)
        except Exception as exc:  # the row expires on its own
            log.warning("could not remove the presence row: %s: %s", type(exc).__name__, exc)

    def _beat(self, conn: psycopg.Connection, live: list[_Attempt]) -> None:
        if not live:
            return
        presence = self._presence
        repo = BlockingAttemptRepo(conn)
        with conn.transaction():
            repo.beat([a.job_id for a in live], [a.run_lease for a in live])
            if presence is not None:
                repo.keep_presence(*presence)

    def _end(self, conn: psycopg.Connection, a: _Attempt) -> None:
        repo = BlockingAttemptRepo(conn)
        released = False
        with conn.transaction():
            if a.release:
                released = repo.give_back(a.job_id, a.run_lease, a.progress)
            repo.ack_ended(a.job_id, a.run_lease)
        if released:  # after the commit: a NOTIFY inside would hold the notify lock (ADR 018)
            repo.wake([a.queue])
        with self._lock:
            self._attempts.pop((a.job_id, a.run_lease), None)
        with self._changed:
            self.ended += 1
            self._changed.notify_all()
