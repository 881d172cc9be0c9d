"""Leader-only maintenance: promote due jobs, rescue dead or overdue attempts, prune by retention.

One leader per database: the process holding the lease row ``awa_fast.leader_lease``
(migration 028, ADR 028), claimed when it has expired and renewed at every election tick on the
election's own connection. A process connected directly first takes the session advisory lock
``sql.LEADER_LOCK_KEY`` on that connection, and holding it may take over a lease taken the same
way (its holder is gone): if the lock connection dies the lock is released and another process
takes over at its next election tick. A frozen direct leader keeps the connection open: a holder
whose lock connection stayed idle past ``heartbeat_staleness_ms`` is displaced
(``sql.DISPLACE_FROZEN_LEADER``), since a live leader uses it every staleness / 3. Through a
transaction pooler (``pooler="transaction"``) there is no lock (session state): a dead or
frozen leader's lease expires.

The fencing rule (docs/architecture.md): taking the lease is followed, in the same transaction,
by bumping ``awa_fast.leader.epoch``; every write transaction of a leader pass starts with
:meth:`Maintenance.fenced`, which locks that row ``FOR SHARE`` at this process's epoch. The
bump waits for the old epoch's open transactions, and a pass of a deposed leader finds no row and
raises :class:`Deposed` (its transaction writes nothing). So leader writes of two epochs never
overlap, and a deposed process steps down at its first fenced pass.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import functools
import logging
import math
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import psycopg

from awa_fast import bulk, metrics, pg_connection, sql
from awa_fast import pooler as pooler_mode
from awa_fast.errors import ConfigError
from awa_fast.retryable import Retry, classify
from awa_fast.rows import one_row
from awa_fast.schema_binding import DEFAULT, SchemaBinding
from awa_fast.worker.observe import Signal

# Maintenance.fenced, as handed to an extra task: a pool connection in a fenced transaction.
Fenced = Callable[[], AbstractAsyncContextManager[psycopg.AsyncConnection]]

log = logging.getLogger("awa_fast.maintenance")

RELEASE_S = 2.0  # a stepping-down leader's wait to free its lease (else it expires on its own)
MAX_BACKOFF_S = 30.0  # a failing loop retries after interval * 2^(failures-1), at most this
DEAD_AFTER_FAILURES = 3  # a loop that failed this many passes in a row is reported dead
# A prune pass deletes expired DLQ rows in batches of cleanup_batch_size, each its own
# transaction, until none is left or this many batches ran (100,000 rows by default): one
# batch a pass could not keep up with a DLQ filling faster than 1000 rows a minute.
DLQ_PRUNE_BATCHES = 100
# A rescue pass takes stale attempts (and, apart, expired callbacks) 500 at a time, each batch
# its own transaction, until a batch comes back short or this many ran.
RESCUE_BATCH = 500
RESCUE_BATCHES = 20
# awa turns a retention into a Rust Duration (Duration::from_secs_f64, awa-python client.rs):
# less than 2**64 seconds, its limit (check_retention).
AWA_MAX_RETENTION_S = float(2**64)
# A retention of 5,000 years or more keeps rows forever (retention_s gives None): now() minus a
# longer one leaves PostgreSQL's range (timestamps from 4713 BC; intervals about 292,000 years),
# and a finished row's finalized_at is its finishing statement's now() (an edit is refused,
# migration 022), so no row written since 2974 BC is that old.
KEEP_FOREVER_S = 5000 * 365.25 * 86400
# Hours of retention the slices expire by truncation alone, per class (completed; failed and
# cancelled): a slice is written again RING_SLOTS periods after it was first written and must
# expire before then, with a period to spare (the one written now). Beyond it, rows are deleted
# row by row (MaintenanceConfig.queue_retention_params; ADR 029).
RING_KEEPS_HOURS = (
    (sql.RING_SLOTS - 2) * sql.COMPLETED_SLICE_S / 3600,
    (sql.RING_SLOTS - 2) * sql.FAILED_SLICE_S / 3600,
)


# The bulk.Recurring (by ``what``) of each leader loop's passes that redo rows (stuck_rows).
_PASSES_OF = {
    "promote": ("promote",),
    "rescue": ("rescue",),
    "callback_rescue": ("callback rescue",),
    "prune": ("stale mark settle", "DLQ prune", "queue retention"),
}
# The loops that report stuck rows (metrics.MAINTENANCE_STUCK_ROWS's ``loop`` label).
STUCK_LOOPS = tuple(_PASSES_OF)


class Deposed(Exception):
    """A leader pass found that another process took leadership (the epoch moved on)."""


class PassIncomplete(Exception):
    """Some steps of a maintenance pass failed (each logged); the other steps ran. Raised at
    the end of the pass so the loop's health reports it."""


@dataclasses.dataclass
class LoopHealth:
    """One maintenance loop as ``health_check`` reports it.

    Attributes:
        alive: its task is running and it did not fail its last ``DEAD_AFTER_FAILURES`` passes.
        passes: passes completed without error.
        failures: consecutive failed passes (0 after a good one).
        last_error: ``"ExceptionType: message"`` of the latest failure, or ``None``.
        stuck_rows: rows its passes left unchanged and still remember (a trigger refuses
            them, bad data): each warned about once, retried apart every pass while the rows
            behind them go on (``bulk.run_isolated``; ADR 009). For ``prune`` also the rows of
            finished slices whose truncate the last pass saw refused (kept past retention).
            Not a failure of the loop.
    """

    name: str
    alive: bool = True
    passes: int = 0
    failures: int = 0
    last_error: str | None = None
    stuck_rows: int = 0


@dataclasses.dataclass
class MaintenanceConfig:
    """Intervals in milliseconds, retention in hours (awa's defaults)."""

    leader_election_interval_ms: int = 10_000
    promote_interval_ms: int = 250
    heartbeat_rescue_interval_ms: int = 30_000
    heartbeat_staleness_ms: int = 90_000
    deadline_rescue_interval_ms: int = 30_000
    callback_rescue_interval_ms: int = 30_000
    cleanup_interval_ms: int = 60_000
    completed_retention_hours: float = 24.0
    failed_retention_hours: float = 72.0
    dlq_retention_days: float = 30.0
    descriptor_retention_days: float = 30.0  # 0 = keep descriptors forever (awa)
    cleanup_batch_size: int = 1000
    promote_batch_size: int = 4096
    reconcile_interval_ms: int = 1_000
    verify_window_s: float = 3600.0
    hot_vacuum_interval_ms: int = 500
    hot_vacuum_dead_rows: int = 5_000
    hot_vacuum_truncate_bytes: int = 64 * 1024 * 1024
    hot_vacuum_truncate_retry_ms: int = 60_000
    # awa's terminal_count_rollup_interval_ms: the counter fold as its own loop at this
    # interval; None folds with each prune pass (cleanup_interval_ms)
    terminal_count_rollup_interval_ms: int | None = None
    # awa's per-queue retention: queue -> (completed hours, failed/cancelled hours)
    queue_retention: dict[str, tuple[float, float]] = dataclasses.field(default_factory=dict)

    def retention_horizons(self) -> tuple[float, float]:
        """Hours the finished slices keep, per class (completed; failed and cancelled): the
        longest retention of any queue, global or its own (``queue_retention``)."""
        completed = [self.completed_retention_hours]
        failed = [self.failed_retention_hours]
        for c, f in self.queue_retention.values():
            completed.append(c)
            failed.append(f)
        return max(completed), max(failed)

    def queue_retention_params(self) -> list[dict[str, Any]]:
        """The parameters of ``sql.PRUNE_QUEUE_RETENTION``, one dict per class that has rows
        to delete one by one; empty when the slices alone expire every queue's rows.

        A queue's retention is left to the slices (``None`` in ``ages``, or ``default_s`` for
        every queue without one) when it is the class's horizon and the ring keeps that long
        (``RING_KEEPS_HOURS``: 30 h completed, 90 h failed and cancelled). A shorter one is
        deleted row by row; so is every retention of a class whose horizon the ring does not
        keep (ADR 029: a slice is written again before its rows expire). A retention of
        ``KEEP_FOREVER_S`` or more is ``None`` too: nothing deletes its rows."""
        horizons = self.retention_horizons()
        queues = sorted(self.queue_retention)
        out = []
        for i, (states, default_h) in enumerate(
            (
                (["completed"], self.completed_retention_hours),
                (["failed", "cancelled"], self.failed_retention_hours),
            )
        ):
            first_slot = i * sql.RING_SLOTS  # the class's slices (sql.slice_table)
            horizon = horizons[i]
            by_slices = horizon <= RING_KEEPS_HOURS[i]

            def row_age_s(hours: float, horizon: float = horizon, by_slices: bool = by_slices):
                return None if by_slices and hours >= horizon else retention_s(hours)

            ages = [row_age_s(self.queue_retention[q][i]) for q in queues]
            default_s = row_age_s(default_h)
            finite = [a for a in [*ages, default_s] if a is not None]
            if not finite:
                continue
            out.append(
                {
                    "states": states,
                    "queues": queues,
                    "ages": ages,
                    "default_s": default_s,
                    "min_s": min(finite),
                    "first_slot": first_slot,
                    "last_slot": first_slot + sql.RING_SLOTS - 1,
                }
            )
        return out

    @property
    def leader_check_ms(self) -> float:
        """Milliseconds between a leader's statements on its lock connection: at most a third
        of the staleness, since another process displaces a holder idle longer than that
        (sql.DISPLACE_FROZEN_LEADER)."""
        return min(self.leader_election_interval_ms, self.heartbeat_staleness_ms / 3)


def retention_s(hours: float) -> float | None:
    """``hours`` of retention in seconds, or ``None`` from ``KEEP_FOREVER_S`` on (kept forever:
    the statements compare with ``now() - NULL``, which no row passes)."""
    seconds = hours * 3600
    return None if seconds >= KEEP_FOREVER_S else seconds


def check_retention(config: MaintenanceConfig) -> None:
    """Reject a retention awa itself does not accept (ADR 029). awa takes any finite number of
    hours (days for ``descriptor_retention_days``) >= 0 and turns it into a Rust ``Duration``
    (``Duration::from_secs_f64``, awa-python's client.rs), which holds less than 2**64 seconds
    (about 5.1e15 hours); above that awa panics. Every retention below it is kept: up to what
    the slice ring keeps (``RING_KEEPS_HOURS``) by whole-slice truncation, beyond it row by
    row, and from ``KEEP_FOREVER_S`` (5,000 years) on forever.

    Raises:
        ConfigError: ``completed_retention_hours``, ``failed_retention_hours``,
            ``descriptor_retention_days`` or a queue's ``retention`` ``completed_hours`` /
            ``failed_hours`` that is not a finite number >= 0, or is 2**64 seconds or longer,
            naming the field (and the queue) and the limit.
    """
    given = [
        ("completed_retention_hours", 3600, config.completed_retention_hours),
        ("failed_retention_hours", 3600, config.failed_retention_hours),
        ("descriptor_retention_days", 86400, config.descriptor_retention_days),
    ]
    for queue, (completed_h, failed_h) in sorted(config.queue_retention.items()):
        given.append((f"queue {queue!r}: retention completed_hours", 3600, completed_h))
        given.append((f"queue {queue!r}: retention failed_hours", 3600, failed_h))
    for field, unit_s, value in given:
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or value < 0
        ):
            raise ConfigError(
                f"{field} must be a non-negative finite number, got {value!r}",
                field=field,
                limit=">= 0",
            )
        if value * unit_s >= AWA_MAX_RETENTION_S:
            limit = AWA_MAX_RETENTION_S / unit_s
            raise ConfigError(
                f"{field}={value!r} is longer than awa accepts (less than {limit:.4g} "
                f"{'hours' if unit_s == 3600 else 'days'}: 2**64 seconds, the longest Rust "
                "Duration awa converts a retention to)",
                field=field,
                limit=f"< {limit:.4g}",
            )


class Maintenance:
    """Runs the leader election loop and, while leader, the maintenance loops.

    ``on_rescued`` (optional) is awaited with the rescued rows after each rescue commits
    (registered Rescued specs). ``consequence_kinds()`` lists the kinds whose final-attempt
    rescue goes to ``consequence_pending`` instead of ``failed`` (the settler then settles them
    in the reconciler: the failure consequence and exhausted specs). ``own_attempts()`` lists
    the attempts this process still runs (``"id:run_lease"``): a stale heartbeat never rescues
    them (their beats stalled; a passed deadline still does). ``extra_tasks`` are
    ``(interval_s, fn)``; ``fn(fenced)`` gets :meth:`fenced` for its write transactions.
    ``pooler`` is the client's connection mode: ``"transaction"`` elects by the lease row
    alone (on a connection of its own without session state); otherwise the advisory lock on
    the lock connection comes first (ADR 028).
    """

    def __init__(
        self,
        database_url: str,
        pool_getter: Callable,
        config: MaintenanceConfig,
        on_rescued: Callable[[list[tuple]], Awaitable[None]] | None = None,
        extra_tasks: list[tuple[float, Callable[[Fenced], Awaitable[Any]]]] | None = None,
        consequence_kinds: Callable[[], list[str]] = list,
        known_kinds: Callable[[], list[str]] = list,
        own_attempts: Callable[[], list[str]] = list,
        pooler: str | None = None,
        binding: SchemaBinding = DEFAULT,
    ):
        check_retention(config)
        self.database_url = database_url
        # the connection mode (awa_fast.pooler): through a transaction pooler no advisory lock
        # (session state): leadership by the lease alone
        self.pooler = pooler
        self.via_lock = pooler_mode.session_state_allowed(pooler)
        # the schema it maintains: its own lock connection and leader key (ADR 027)
        self.binding = binding
        self._connection_class = pg_connection.connection_class(binding)
        self._pool_getter = pool_getter
        self.config = config
        self.on_rescued = on_rescued
        self.extra_tasks = extra_tasks or []
        self.consequence_kinds = consequence_kinds
        self.known_kinds = known_kinds
        self.own_attempts = own_attempts
        self.is_leader = False
        self.epoch: int | None = None  # set when elected; kept after stepping down (fences)
        self._lock_conn: psycopg.AsyncConnection | None = None
        self._loops: list[asyncio.Task] = []
        self._deposed = asyncio.Event()
        self.loops: dict[str, LoopHealth] = {}
        self.counts = {
            "promoted": 0,
            "rescued": 0,
            "pruned": 0,
            "hot_vacuums": 0,
            "hot_truncations": 0,
        }
        self._vacuum_conn: psycopg.AsyncConnection | None = None
        # One per kind of pass: a row a pass cannot process fails the same way every pass, and
        # is warned about once (bulk.Recurring).
        self._recurring: collections.defaultdict[str, bulk.Recurring] = collections.defaultdict(
            bulk.Recurring
        )
        self._truncate_failed_at: float | None = None  # the event loop's clock, seconds
        # rows of the finished slices whose TRUNCATE the last expiry pass saw refused (a
        # trigger): kept past retention, reported as the prune loop's stuck_rows
        self._refused_slices: dict[int, int] = {}
        # consecutive election attempts that failed with an error (not "another process
        # leads") and the latest error: health_check reports an election that keeps failing
        self.election_failures = 0
        self.election_error: str | None = None
        # fired after each pass of a leader loop with (loop name, its result or exception)
        self.passed = Signal("maintenance pass")
        # fired after each election attempt of run() (value: its exception, or None)
        self.elections = Signal("election attempt")
        # fired when this process takes or gives up leadership (value: is_leader)
        self.leadership = Signal("leadership")

    async def run(self) -> None:
        """Elect forever (cancel to stop; the lock connection is closed on the way out)."""
        interval = self.config.leader_check_ms / 1000
        try:
            while True:
                try:
                    await self._elect()
                    self.election_failures, self.election_error = 0, None
                    self.elections.fire(None)
                except Exception as exc:  # the election loop itself must never end
                    log.warning("leader election failed: %s: %s", type(exc).__name__, exc)
                    self.election_failures += 1
                    self.election_error = f"{type(exc).__name__}: {exc}"
                    await self._step_down()
                    self.elections.fire(exc)
                # A pass that found itself deposed wakes the election at once.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._deposed.wait(), interval)
        finally:
            await self._step_down()

    async def _elect(self) -> None:
        if self.is_leader:
            if self._deposed.is_set():
                await self._step_down()
            else:
                # the lease renewed at our epoch (on the lock connection, if any: still
                # connected) means still leader
                if await self._renew():
                    return
                log.warning("maintenance leadership lost: the epoch moved past %s", self.epoch)
                await self._step_down()
        self._deposed.clear()
        if await self.acquire():
            self._start_loops()

    async def acquire(self) -> bool:
        """Try to take leadership now: the advisory lock on the lock connection (not through a
        transaction pooler), then the lease and the epoch bump that fences off the previous
        leader, in one transaction (waiting up to ``max(leader_election_interval_ms, 1 s)`` for
        its open passes). Starts no loops (:meth:`run` does); passes may be run by hand
        afterwards. Returns ``is_leader``.

        Raises:
            psycopg.Error: the database failed (the caller steps down).
        """
        if self.is_leader:
            return True
        if not self.via_lock:
            epoch = await self._bump_epoch(await self._own_conn())
        else:
            if not await self._lock():
                return False
            assert self._lock_conn is not None  # _lock() opened it
            epoch = await self._bump_epoch(self._lock_conn)
            if epoch is None:  # a lease-only leader (through a pooler) holds the lease
                await self._close_lock_conn()
        if epoch is None:
            return False
        self.epoch = epoch
        self.is_leader = True
        metrics.LEADER.set(1)
        self.leadership.fire(True)
        log.info("became maintenance leader (epoch %s)", self.epoch)
        return True

    async def _lock(self) -> bool:
        """Take the advisory lock on the lock connection (opened if needed), displacing a
        frozen holder (docs/architecture.md, "the leader's fencing rule", 4)."""
        conn = await self._own_conn()
        cur = await conn.execute(sql.TRY_LEADER, (self.binding.leader_lock_key,))
        if not (await one_row(cur))[0]:
            cur = await conn.execute(
                sql.DISPLACE_FROZEN_LEADER,
                {
                    "key": self.binding.leader_lock_key,
                    "stale_ms": self.config.heartbeat_staleness_ms,
                },
            )
            if not (await one_row(cur))[0]:
                return False
            log.warning(
                "displaced a frozen maintenance leader (its lock connection idle for "
                "more than heartbeat_staleness_ms=%s)",
                self.config.heartbeat_staleness_ms,
            )
            cur = await conn.execute(sql.TRY_LEADER, (self.binding.leader_lock_key,))
            if not (await one_row(cur))[0]:
                return False
        return True

    async def _bump_epoch(self, conn: psycopg.AsyncConnection) -> int | None:
        """Claim the lease and bump the leader row (fencing off the previous leader) in one
        transaction, waiting up to ``max(leader_election_interval_ms, 1 s)`` for its open
        passes. ``None``: the lease is held (another process leads). If the wait times out, the
        passes idle in transaction past the staleness are frozen: terminate them and try once
        more.

        Raises:
            psycopg.errors.LockNotAvailable: a previous leader's pass still holds the row.
        """
        wait_ms = max(self.config.leader_election_interval_ms, 1000)
        holder = f"{socket.gethostname()} pid {os.getpid()}"
        for last in (False, True):
            try:
                async with conn.transaction():
                    await conn.execute(sql.LOCK_TIMEOUT_LOCAL.format(ms=int(wait_ms)))
                    await conn.execute(sql.PASS_IDLE_TIMEOUT)  # a take frozen mid-way ends
                    await conn.execute(sql.LEASE_ENSURE)
                    cur = await conn.execute(
                        sql.LEASE_TAKE,
                        {
                            "holder": holder,
                            "via_lock": self.via_lock,
                            "stale_ms": self.config.heartbeat_staleness_ms,
                        },
                    )
                    if await cur.fetchone() is None:
                        return None
                    cur = await conn.execute(sql.LEADER_BUMP, (holder,))
                    epoch = (await one_row(cur))[0]
                    await conn.execute(sql.LEASE_EPOCH, (epoch,))
                    return epoch
            except psycopg.errors.LockNotAvailable:
                if last:
                    raise
                cur = await conn.execute(
                    sql.DISPLACE_FROZEN_PASSES, {"stale_ms": self.config.heartbeat_staleness_ms}
                )
                if not (await one_row(cur))[0]:
                    raise
                log.warning("terminated a frozen pass of the previous maintenance leader")
        raise AssertionError("unreachable")

    async def _own_conn(self) -> psycopg.AsyncConnection:
        """The election's own connection (opened if needed): the lock connection, or through a
        transaction pooler one without session state (a client connection the pooler gives a
        server connection per transaction). Its own, not the pool's: handlers holding every
        pool connection must not keep the leader from renewing its lease."""
        conn = self._lock_conn
        if conn is None or conn.closed:
            conn = self._lock_conn = await self._connection_class.connect(
                self.database_url, autocommit=True, **pooler_mode.connect_options(self.pooler)
            )
        return conn

    @contextlib.asynccontextmanager
    async def _lease_conn(self) -> AsyncIterator[psycopg.AsyncConnection]:
        """Where the leader renews and frees its lease: the connection it was elected on (a
        lost one fails the renewal: the leader steps down)."""
        if self._lock_conn is None or self._lock_conn.closed:
            raise psycopg.OperationalError("the leader's own connection is closed")
        yield self._lock_conn

    async def _renew(self) -> bool:
        """Renew the lease at this process's epoch; False when the epoch moved on (deposed).

        Raises:
            psycopg.Error: the database failed, or the lease row stayed locked (a process
                taking the expired lease) for ``max(leader_election_interval_ms, 1 s)``.
        """
        wait_ms = max(self.config.leader_election_interval_ms, 1000)
        async with self._lease_conn() as conn:
            async with conn.transaction():
                await conn.execute(sql.LOCK_TIMEOUT_LOCAL.format(ms=int(wait_ms)))
                # a renewal frozen mid-way (its host cut off) must not hold the lease row and
                # the lock connection for as long as its dead TCP connection stays open
                await conn.execute(sql.PASS_IDLE_TIMEOUT)
                cur = await conn.execute(
                    sql.LEASE_RENEW,
                    {"epoch": self.epoch, "stale_ms": self.config.heartbeat_staleness_ms},
                )
                return await cur.fetchone() is not None

    async def _release(self) -> None:
        """Free the lease held at this process's epoch (a stepping-down leader), bounded: the
        lease expires on its own."""
        try:
            async with asyncio.timeout(RELEASE_S):
                async with self._lease_conn() as conn:
                    await conn.execute(sql.LEASE_RELEASE, (self.epoch,))
        except (Exception, TimeoutError) as exc:
            log.info("maintenance lease left to expire: %s: %s", type(exc).__name__, exc)

    async def _close_lock_conn(self) -> None:
        if self._lock_conn is not None:
            try:
                await self._lock_conn.close()
            except Exception:  # closing a dead connection may fail; it is gone either way
                pass
            self._lock_conn = None

    def _start_loops(self) -> None:
        c = self.config
        rescue_ms = min(c.heartbeat_rescue_interval_ms, c.deadline_rescue_interval_ms)
        loops: list[tuple[str, float, Callable[[], Awaitable[Any]]]] = [
            ("promote", c.promote_interval_ms / 1000, self.promote),
            ("rescue", rescue_ms / 1000, self.rescue_running),
            ("callback_rescue", c.callback_rescue_interval_ms / 1000, self.rescue_callbacks),
            ("prune", c.cleanup_interval_ms / 1000, self.prune),
            ("vacuum_hot", c.hot_vacuum_interval_ms / 1000, self.vacuum_hot),
        ]
        if c.terminal_count_rollup_interval_ms is not None:
            loops.append(
                ("counter_fold", c.terminal_count_rollup_interval_ms / 1000, self.fold_counts)
            )
        loops += [
            (getattr(fn, "__name__", repr(fn)).lstrip("_"), s, functools.partial(fn, self.fenced))
            for s, fn in self.extra_tasks
        ]
        self.loops = {name: LoopHealth(name) for name, _s, _fn in loops}
        self._loops = [
            asyncio.create_task(self._every(name, s, fn), name=f"awa-maint-{name}")
            for name, s, fn in loops
        ]

    async def _step_down(self) -> None:
        for task in self._loops:
            task.cancel()
        await asyncio.gather(*self._loops, return_exceptions=True)
        self._loops = []
        was_leader = self.is_leader
        if self.is_leader:
            log.info("gave up maintenance leadership (epoch %s)", self.epoch)
        self.is_leader = False
        metrics.LEADER.set(0)
        self._refused_slices = {}
        for loop in _PASSES_OF:  # what a leader's passes remembered is no longer this process's
            metrics.MAINTENANCE_STUCK_ROWS.labels(loop).set(0)
        if was_leader:
            await self._release()
        await self._close_lock_conn()
        if self._vacuum_conn is not None:
            with contextlib.suppress(Exception):  # as the lock connection: gone either way
                await self._vacuum_conn.close()
            self._vacuum_conn = None
        if was_leader:
            self.leadership.fire(False)

    @contextlib.asynccontextmanager
    async def fenced(self, *, bounded: bool = False) -> AsyncIterator[psycopg.AsyncConnection]:
        """A pool connection inside a transaction that holds the leader row ``FOR SHARE`` at
        this process's epoch: the only way a leader pass writes. Nested ``conn.transaction()``
        blocks are savepoints. With ``bounded`` (this class's own passes; not the extra tasks,
        whose user code may wait on its own locks), a lock wait ends after
        ``sql.PASS_LOCK_TIMEOUT`` (2 s) with ``psycopg.errors.LockNotAvailable``, and the server
        ends the session if the transaction sits idle for ``sql.PASS_IDLE_TIMEOUT_S`` (5 s: this
        process stopped mid-pass), releasing its locks.

        Raises:
            Deposed: another process took leadership (nothing of this transaction commits).
        """
        pool = await self._pool_getter()
        async with pool.connection() as conn:
            async with conn.transaction():
                if self.epoch is not None:  # never elected: a pass run by hand (tests, tools)
                    cur = await conn.execute(sql.LEADER_FENCE, (self.epoch,))
                    if await cur.fetchone() is None:
                        raise Deposed(f"epoch {self.epoch} is over: another process leads")
                if bounded:
                    # A pass never waits long on a row or table another session holds: the
                    # statement fails (logged; the pass goes on) instead of stalling the loop.
                    # Nor does it hold its own locks long if this process stops mid-pass.
                    await conn.execute(sql.PASS_LOCK_TIMEOUT)
                    await conn.execute(sql.PASS_IDLE_TIMEOUT)
                yield conn

    def loop_health(self) -> dict[str, LoopHealth]:
        """The leader loops' state (empty when this process is not the leader)."""
        if not self.is_leader:
            return {}
        for task in self._loops:
            name = task.get_name().removeprefix("awa-maint-")
            if task.done() and name in self.loops:
                self.loops[name].alive = False
        for name, health in self.loops.items():
            health.stuck_rows = self.stuck_rows(name)
        return dict(self.loops)

    @property
    def election_failing(self) -> bool:
        """Whether this process's last ``DEAD_AFTER_FAILURES`` election attempts all failed with
        an error (``election_error``; a trigger refusing the epoch bump, say): then no process
        may lead, and nothing promotes, rescues or prunes."""
        return self.election_failures >= DEAD_AFTER_FAILURES

    def stuck_rows(self, loop: str) -> int:
        """Rows the passes of leader loop ``loop`` left unchanged and remember, and for
        ``"prune"`` the rows of the finished slices whose truncate the last expiry pass saw
        refused (see :class:`LoopHealth`)."""
        rows = sum(len(self._recurring[what].left) for what in _PASSES_OF.get(loop, ()))
        if loop == "prune":
            rows += sum(self._refused_slices.values())
        return rows

    async def _every(self, name: str, interval_s: float, fn: Callable[[], Awaitable[Any]]) -> None:
        health = self.loops.setdefault(name, LoopHealth(name))
        while True:
            delay = interval_s
            try:
                try:
                    result = await fn()
                finally:
                    if name in _PASSES_OF:
                        metrics.MAINTENANCE_STUCK_ROWS.labels(name).set(self.stuck_rows(name))
                health.passes += 1
                health.failures = 0
                health.alive = True
                self.passed.fire((name, result))
            except asyncio.CancelledError:
                raise
            except Deposed as exc:
                log.warning("maintenance %s: %s; stepping down", name, exc)
                self._deposed.set()
                return
            except Exception as exc:  # every loop survives every error, logged and backed off
                if classify(exc) is Retry.CLOSED:  # ... but a closed pool: no pass can run
                    log.info("maintenance %s stops: %s", name, exc)
                    health.alive = False
                    health.last_error = f"{type(exc).__name__}: {exc}"
                    self.passed.fire((name, exc))
                    return
                health.failures += 1
                health.last_error = f"{type(exc).__name__}: {exc}"
                health.alive = health.failures < DEAD_AFTER_FAILURES
                delay = min(max(interval_s, 0.1) * 2 ** (health.failures - 1), MAX_BACKOFF_S)
                log.error(
                    "maintenance %s failed (%d in a row; next try in %.1f s)",
                    name,
                    health.failures,
                    delay,
                    exc_info=True,
                )
                self.passed.fire((name, exc))
            # Python 3.11's wait_for (inside the pool) can swallow a cancel that lands as a
            # connection is handed out: honour a pending cancel here so shutdown never hangs.
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise asyncio.CancelledError
            await asyncio.sleep(delay)

    async def promote(self) -> int:
        """Move due scheduled / retryable jobs to available and wake their queues. A row whose
        key another job holds is cancelled as a duplicate; any other row that fails alone is
        left due (logged); the rest are promoted (``bulk.run_isolated``). A row whose previous
        attempt still runs (a fresh "still running" mark) waits until it ends. Due twins that
        share a unique key (``sql.PROMOTE``): the first is promoted, the others are cancelled as
        duplicates in the same statement (logged at INFO). Returns the rows promoted."""
        limit = {
            "limit": self.config.promote_batch_size,
            "stale_ms": self.config.heartbeat_staleness_ms,
        }
        async with self.fenced(bounded=True) as conn:
            done = await bulk.run_isolated(
                conn,
                what="promote",
                bulk=lambda: _fetch(conn, sql.PROMOTE, limit),
                keys=lambda skip: _ids(_fetch(conn, sql.DUE_IDS, {**limit, "skip": skip})),
                one=lambda job_id: _fetch(conn, sql.PROMOTE_ONE, {**limit, "id": job_id}),
                on_conflict=lambda job_id, _exc: self._cancel_duplicate(
                    conn, sql.CANCEL_AS_DUPLICATE, {**limit, "id": job_id}
                ),
                recurring=self._recurring["promote"],
                batch=self.config.promote_batch_size,
            )
        twins = [job_id for job_id, _queue, cancelled in done.rows if cancelled]
        if twins:
            log.info(
                "%d due job(s) cancelled as duplicates of a due twin with their unique key: %s",
                len(twins),
                twins[:20],
            )
        promoted = [(job_id, queue) for job_id, queue, cancelled in done.rows if not cancelled]
        queues = sorted({queue for _id, queue in promoted})
        if queues:  # after the commit: a NOTIFY inside would hold the notify lock (ADR 018)
            try:
                pool = await self._pool_getter()
                async with pool.connection() as conn:
                    await conn.execute(sql.WAKE_QUEUES, (queues,))
            except psycopg.Error as exc:  # the promotion committed; dispatchers poll
                log.warning("wake-up NOTIFY for promoted queues %s failed: %s", queues, exc)
        self.counts["promoted"] += len(promoted)
        return len(promoted)

    async def _cancel_duplicate(self, conn, query: str, params: dict) -> None:
        cur = await conn.execute(query, params)
        if cur.rowcount:
            log.warning(
                "job %s cancelled as a duplicate: its new state would take a unique "
                "key another job holds",
                params["id"],
            )

    async def rescue_running(self) -> list[tuple]:
        """The heartbeat / deadline rescue loop's pass (see :meth:`rescue`)."""
        return await self.rescue(callbacks=False)

    async def rescue_callbacks(self) -> list[tuple]:
        """The expired-callback rescue loop's pass (``callback_rescue_interval_ms``)."""
        return await self.rescue(running=False)

    async def rescue(self, *, running: bool = True, callbacks: bool = True) -> list[tuple]:
        """Rescue running attempts with a stale heartbeat or a passed deadline (``running``), and
        parked jobs whose callback timed out (``callbacks``). Final attempts fail (moved to the
        DLQ when their queue has it) or, for ``consequence_kinds()`` (a failure consequence or
        exhausted specs), wait in ``consequence_pending`` for the reconciler's settlement.
        Returns rows ``(id, kind, new_state, rescue_reason, exhausted_reason)``.

        In batches of ``RESCUE_BATCH`` (500), each one transaction, until a batch comes back
        short or ``RESCUE_BATCHES`` (20) ran: a batch's rescue and the dead-letter moves of the
        rows it failed commit together. A row whose rescue collides on its unique key is cancelled as a duplicate; a
        row whose dead-letter move fails stays ``failed`` in ``jobs`` with that error appended;
        any other row that fails alone is left as it was (logged); the rest proceed."""
        params = {
            "stale_ms": self.config.heartbeat_staleness_ms,
            "limit": RESCUE_BATCH,
            "consequence_kinds": self.consequence_kinds(),
            "known_kinds": self.known_kinds(),
            "only": None,
        }
        rows: list[tuple] = []
        # Batch after batch, each its own transaction, while one comes back full: one batch a
        # pass (500 every 30 s) took minutes to rescue what a crashed launcher left running.
        for _ in range(RESCUE_BATCHES):
            async with self.fenced(bounded=True) as conn:
                # Read once the connection is held, with no await before the statement: an
                # attempt claimed while the pass waited for its connection is in it.
                params["own"] = self.own_attempts()
                found: list[tuple] = []
                if running:
                    found += await self._rescue_with(
                        conn, "rescue", sql.RESCUE, sql.RESCUE_CANDIDATES, params
                    )
                if callbacks:
                    found += await self._rescue_with(
                        conn,
                        "callback rescue",
                        sql.RESCUE_CALLBACKS,
                        sql.RESCUE_CALLBACK_CANDIDATES,
                        params,
                    )
                await self._dead_letter(conn, [(r[0], r[4]) for r in found if r[2] == "failed"])
            rows += found
            if len(found) < RESCUE_BATCH:
                break
        if rows:
            self.counts["rescued"] += len(rows)
            metrics.rescued(rows)
            log.info("rescued %d job(s)", len(rows))
            if self.on_rescued is not None:
                await self.on_rescued(rows)
        return rows

    async def _rescue_with(
        self, conn, what: str, query: str, candidates: str, params: dict
    ) -> list[tuple]:
        done = await bulk.run_isolated(
            conn,
            what=what,
            bulk=lambda: _fetch(conn, query, params),
            keys=lambda skip: _ids(_fetch(conn, candidates, {**params, "skip": skip})),
            one=lambda job_id: _fetch(conn, query, {**params, "only": job_id}),
            on_conflict=lambda job_id, _exc: self._cancel_duplicate(
                conn, sql.CANCEL_RESCUED_DUPLICATE, {**params, "id": job_id}
            ),
            recurring=self._recurring[what],
            batch=params["limit"],
        )
        return done.rows

    async def _dead_letter(self, conn, moves: list[tuple[int, str]]) -> None:
        # Inside the rescue's transaction; a row whose move fails stays failed (noted).
        if not moves:
            return

        async def note(job_id, exc):
            await conn.execute(sql.NOTE_DEAD_LETTER_FAILED, {"id": job_id, "error": str(exc)})

        reasons = dict(moves)
        await bulk.run_isolated(
            conn,
            what="dead-letter move",
            bulk=lambda: _fetch(
                conn, sql.DEAD_LETTER_MANY, ([m[0] for m in moves], [m[1] for m in moves])
            ),
            keys=[m[0] for m in moves],
            one=lambda job_id: _fetch(conn, sql.DEAD_LETTER, (job_id, reasons[job_id])),
            on_conflict=note,
            on_error=note,
        )

    async def prune(self) -> int:
        """Expire finished jobs and DLQ entries past their retention. Returns the rows removed.

        Finished jobs go a whole slice at a time (:meth:`expire_slices`: one TRUNCATE, no
        per-row delete); DLQ entries older than ``dlq_retention_days`` in batches of
        ``cleanup_batch_size`` rows until a batch comes up short (none left) or
        ``DLQ_PRUNE_BATCHES`` (100) batches ran (a row whose delete fails alone, say a trigger
        refuses it, is kept and logged). A finished row the hot table kept for a stale "still
        running" mark moves to the finished storage. The finished rows of a queue whose
        retention is shorter than its class's horizon (the longest of any queue, which the
        slices keep: ``queue_retention``), and every finished row past its retention in a class
        whose horizon is longer than the ring keeps (``RING_KEEPS_HOURS``, ADR 029), are
        deleted row by row first, in batches as the DLQ's (``sql.PRUNE_QUEUE_RETENTION``): at
        most ``DLQ_PRUNE_BATCHES * cleanup_batch_size`` rows per class a pass.

        Each step (presence, callback expressions, batch operations, stale marks, the counter
        fold, descriptors, each DLQ batch, the slices) runs in its own transaction; a step
        that fails is logged and the others run.

        Raises:
            PassIncomplete: after every step ran, when some failed (named in the message).
            Deposed: another process took leadership.
        """
        c = self.config
        params = {
            "dlq_s": c.dlq_retention_days * 86400,
            "limit": c.cleanup_batch_size,
            "stale_ms": c.heartbeat_staleness_ms,
        }
        failed: list[str] = []

        async def step(what: str, run: Callable[[psycopg.AsyncConnection], Awaitable[int]]) -> int:
            # Each step is its own fenced transaction: one that fails (a trigger, a lock wait
            # past PASS_LOCK_TIMEOUT) is logged and the others go on, slice expiry included.
            try:
                async with self.fenced(bounded=True) as conn:
                    return await run(conn)
            except psycopg.Error as exc:
                log.warning("prune step %s failed this pass: %s: %s", what, type(exc).__name__, exc)
                failed.append(f"{what} ({type(exc).__name__})")
                return 0

        def execute(query: str, params: dict | None = None) -> Callable:
            async def run(conn: psycopg.AsyncConnection) -> int:
                await conn.execute(query, params)
                return 0

            return run

        def isolated(
            what: str, bulk_q: str, ids_q: str, one_q: str, extra: dict | None = None
        ) -> Callable:
            p = {**params, **(extra or {})}

            async def run(conn: psycopg.AsyncConnection) -> int:
                done = await bulk.run_isolated(
                    conn,
                    what=what,
                    bulk=functools.partial(_fetch, conn, bulk_q, p),
                    keys=lambda skip: _fetch_ids(conn, ids_q, {**p, "skip": skip}),
                    one=functools.partial(_fetch_id, conn, one_q, p),
                    recurring=self._recurring[what],
                    batch=c.cleanup_batch_size,
                )
                return len(done.rows)

            return run

        await step("worker presence", execute(sql.WORKERS_PRUNE))
        await step("callback expressions", execute(sql.CALLBACK_EXPRESSIONS_PRUNE))
        await step("batch operations", execute(sql.BATCH_RETENTION_PRUNE))
        await step(
            "stale mark settle",
            isolated(
                "stale mark settle",
                sql.SETTLE_STALE_MARKS,
                sql.STALE_MARK_IDS,
                sql.SETTLE_STALE_MARK_ONE,
            ),
        )
        if c.terminal_count_rollup_interval_ms is None:  # else its own loop (fold_counts)
            await step("counter fold", _fold)
        if c.descriptor_retention_days > 0:
            await step(
                "descriptors",
                execute(
                    sql.DESCRIPTORS_PRUNE,
                    {"retention_s": retention_s(c.descriptor_retention_days * 24)},
                ),
            )
        pruned = 0
        dlq_prune = isolated("DLQ prune", sql.PRUNE_DLQ, sql.PRUNE_DLQ_IDS, sql.PRUNE_DLQ_ONE)
        for _ in range(DLQ_PRUNE_BATCHES):
            removed = await step("DLQ", dlq_prune)
            pruned += removed
            # A short batch: none left, the step failed, or refused rows (kept, retried apart
            # by the next batch's redo; one that still fills a batch goes on: ADR 009).
            if removed < c.cleanup_batch_size:
                break
        for class_params in c.queue_retention_params():
            queue_prune = isolated(
                "queue retention",
                sql.PRUNE_QUEUE_RETENTION,
                sql.PRUNE_QUEUE_RETENTION_IDS,
                sql.PRUNE_QUEUE_RETENTION_ONE,
                class_params,
            )
            for _ in range(DLQ_PRUNE_BATCHES):
                removed = await step("queue retention", queue_prune)
                pruned += removed
                if removed < c.cleanup_batch_size:
                    break
        pruned += await self.expire_slices()
        self.counts["pruned"] += pruned
        if failed:
            raise PassIncomplete(f"prune steps failed: {', '.join(failed)}; the others ran")
        return pruned

    async def fold_counts(self) -> int:
        """Fold the finished-job counters (``sql.FOLD_COUNTS``) in one fenced transaction: awa's
        terminal-count rollup. Run by the prune pass, or as the ``counter_fold`` loop every
        ``terminal_count_rollup_interval_ms`` when that is set. Returns 0 (rows are folded,
        not removed).

        Raises:
            Deposed: another process took leadership.
            psycopg.Error: the fold failed (the loop retries).
        """
        async with self.fenced(bounded=True) as conn:
            return await _fold(conn)

    async def expire_slices(self) -> int:
        """TRUNCATE every finished slice whose newest row is past its class's horizon
        (``completed_retention_hours``; ``failed_retention_hours`` for failed and cancelled; a
        longer per-queue retention raises it: ``MaintenanceConfig.retention_horizons``; one of
        ``KEEP_FOREVER_S`` or more expires none), releasing the unique keys its jobs held.
        Returns the rows removed.

        Each slice is its own fenced transaction: its partition is locked ACCESS EXCLUSIVE
        (waiting at most 200 ms: readers and writers queue behind it), its expiry checked again under the lock, then
        truncated. A slice that cannot be locked or truncated is kept (logged) and tried next
        pass; the others are pruned. A slice whose truncate is refused pass after pass (a
        trigger) is warned about once (:class:`bulk.Recurring`), and its rows count in the
        prune loop's ``stuck_rows`` until a pass truncates it; a lock wait is logged each time.

        Raises:
            Deposed: another process took leadership.
        """
        # the longest retention of any queue: a queue's shorter one is pruned row by row
        completed_h, failed_h = self.config.retention_horizons()
        # None (kept forever) expires no slice
        ages = {"completed_s": retention_s(completed_h), "failed_s": retention_s(failed_h)}
        pool = await self._pool_getter()
        async with pool.connection() as conn:
            expired = [r[0] for r in await _fetch(conn, sql.EXPIRED_SLICES, ages)]
        pruned = 0
        kept = self._recurring["finished slice"]
        refused: dict[int, int] = {}
        for slot in expired:
            rows = None
            try:
                async with self.fenced(bounded=True) as conn:
                    await conn.execute(sql.SLICE_LOCK_TIMEOUT)
                    await conn.execute(sql.lock_slice(slot))
                    cur = await conn.execute(sql.EXPIRED_SLICE, {**ages, "slot": slot})
                    row = await cur.fetchone()
                    if row is not None:
                        rows = row[0]
                        await conn.execute(sql.truncate_slice(slot))
                        await conn.execute(sql.RELEASE_SLICE, {"slot": slot})
                        pruned += row[0]
            except psycopg.Error as exc:
                args = ("finished slice %s kept this pass: %s: %s", slot, type(exc).__name__, exc)
                if bulk.is_row_error(exc):  # refused by what it holds (a trigger): every pass
                    kept.warn(log, slot, bulk.error_signature(exc), *args)
                    refused[slot] = rows or 1  # a slice whose count was not read: at least 1
                else:  # a lock wait, a lost connection: as it happens
                    log.warning(*args)
        kept.pass_done()
        self._refused_slices = refused
        return pruned

    async def vacuum_hot(self) -> bool:
        """VACUUM the hot table when its dead rows passed ``hot_vacuum_dead_rows``, or when the
        statistics have seen no vacuum of it (reset by crash recovery or ``pg_stat_reset``,
        which zero the dead-row count but leave the dead rows; with ``track_counts`` off they
        never count, so every pass vacuums), on a connection of its own (autocommit).
        Autovacuum visits a database at most once per ``autovacuum_naptime`` (60 s by
        default): at thousands of jobs per second that alone leaves hundreds of thousands of
        dead rows between visits. Returns True if it vacuumed.

        The empty pages at the table's end are cut off only while its heap is larger than
        ``hot_vacuum_truncate_bytes`` (64 MiB; after a backlog drained): cutting them off takes
        an ACCESS EXCLUSIVE lock that stops every claim, insert and completion, and at a steady
        rate the table grows back within a second (ADR 016, migration 016). Above the limit it
        asks whatever the dead rows (a backlog drained before a quiet spell). One that asked and
        did not leave the heap below the limit (PostgreSQL gave up after waiting 5 s for the
        lock, the tail still held live rows, autovacuum held the table, or the VACUUM raised)
        does not ask again for ``hot_vacuum_truncate_retry_ms`` (60 s): each such wait is 5 s
        without a vacuum. ``counts["hot_truncations"]`` counts the vacuums that asked.

        Raises:
            psycopg.Error: the statistics or the VACUUM failed (the loop retries).
        """
        if self._vacuum_conn is None or self._vacuum_conn.closed or self._vacuum_conn.broken:
            self._vacuum_conn = await self._connection_class.connect(
                self.database_url, autocommit=True, **pooler_mode.connect_options(self.pooler)
            )
        conn = self._vacuum_conn
        loop = asyncio.get_running_loop()
        cur = await conn.execute(sql.HOT_DEAD_ROWS)
        row = await cur.fetchone()
        if row is None:
            return False
        limit = self.config.hot_vacuum_truncate_bytes
        failed_at = self._truncate_failed_at
        retry_s = self.config.hot_vacuum_truncate_retry_ms / 1000
        if row[1] > limit and (failed_at is None or loop.time() - failed_at >= retry_s):
            # Also with few dead rows: a backlog drained before a quiet spell must still be cut.
            # Counted as failed until the heap is seen below the limit (a VACUUM that raises,
            # or is skipped, does not ask again at once either).
            self._truncate_failed_at = loop.time()
            self.counts["hot_truncations"] += 1
            await conn.execute(sql.VACUUM_HOT_TRUNCATING)
            after = await (await conn.execute(sql.HOT_DEAD_ROWS)).fetchone()
            if after is not None and after[1] <= limit:
                self._truncate_failed_at = None
        elif row[0] < self.config.hot_vacuum_dead_rows and row[2]:
            # (Statistics that have seen no vacuum were reset, by crash recovery say: their
            # count of zero says nothing of the dead rows a quiet table still holds.)
            return False
        else:
            await conn.execute(sql.VACUUM_HOT)
        self.counts["hot_vacuums"] += 1
        return True


async def _fold(conn: psycopg.AsyncConnection) -> int:
    cur = await conn.execute(sql.LOCK_FOLDABLE_SLOTS)
    slots = (await one_row(cur))[0]
    if slots:
        await conn.execute(sql.FOLD_COUNTS, {"slots": slots})
    return 0


async def _fetch(conn, query: str, params) -> list[tuple]:
    return await (await conn.execute(query, params)).fetchall()


async def _ids(rows: Awaitable[list[tuple]]) -> list[int]:
    return [r[0] for r in await rows]


async def _fetch_ids(conn, query: str, params: dict) -> list[int]:
    return await _ids(_fetch(conn, query, params))


async def _fetch_id(conn, query: str, params: dict, job_id: int) -> list[tuple]:
    return await _fetch(conn, query, {**params, "id": job_id})
