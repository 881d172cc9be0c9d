"""Leadership: one maintenance leader per database, and the fence on its writes.

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
:meth:`Leadership.fenced`, which locks that row ``FOR SHARE`` at this process's epoch. The
bump waits for the old epoch's open transactions, and a pass of a deposed leader finds no row and
raises :class:`Deposed` (its transaction writes nothing). So leader writes of two epochs never
overlap, and a deposed process steps down at its first fenced pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager

import psycopg

from awa_fast import metrics, pg_connection
from awa_fast import pooler as pooler_mode
from awa_fast.repo.leadership import LeaderRepo
from awa_fast.schema_binding import SchemaBinding
from awa_fast.worker.maintenance.config import MaintenanceConfig

# Leadership.fenced, as handed to an extra task: a pool connection in a fenced transaction.
Fenced = Callable[[], AbstractAsyncContextManager[psycopg.AsyncConnection]]

log = logging.getLogger("awa_fast.maintenance")

RELEASE_S = 2.0  # a stepping-down leader's wait to free its lease (else it expires on its own)


class Deposed(Exception):
    """A leader pass found that another process took leadership (the epoch moved on)."""


class Leadership:
    """This process's claim on maintenance leadership: the election's own connection (the
    lock connection, or one without session state through a transaction pooler), the lease,
    the epoch, and :meth:`fenced`, the transaction every leader write runs in.

    ``pooler`` is the client's connection mode: ``"transaction"`` elects by the lease row
    alone; otherwise the advisory lock on the lock connection comes first (ADR 028).

    Attributes:
        is_leader: whether this process holds the lease at :attr:`epoch`.
        epoch: the leader row's epoch this process took (``None`` before the first election;
            kept after stepping down: it still fences).
        lock_conn: the election's own connection, or ``None`` when closed.
    """

    def __init__(
        self,
        database_url: str,
        pool_getter: Callable,
        config: MaintenanceConfig,
        pooler: str | None,
        binding: SchemaBinding,
    ):
        self.database_url = database_url
        self.config = config
        # through a transaction pooler no advisory lock (session state): the lease alone
        self.pooler = pooler
        self.via_lock = pooler_mode.session_state_allowed(pooler)
        # the schema it maintains: its own lock connection and leader key (ADR 027)
        self.binding = binding
        self._connection_class = pg_connection.connection_class(binding)
        self._pool_getter = pool_getter
        self.is_leader = False
        self.epoch: int | None = None
        self.lock_conn: psycopg.AsyncConnection | None = None

    async def acquire(self) -> bool:
        """Try to take leadership now: the advisory lock on the lock connection (not through a
        transaction pooler), then the lease and the epoch bump that fences off the previous
        leader, in one transaction (waiting up to ``max(leader_election_interval_ms, 1 s)`` for
        its open passes). Returns ``is_leader``.

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
            assert self.lock_conn is not None  # _lock() opened it
            epoch = await self._bump_epoch(self.lock_conn)
            if epoch is None:  # a lease-only leader (through a pooler) holds the lease
                await self.close()
        if epoch is None:
            return False
        self.epoch = epoch
        self.is_leader = True
        metrics.LEADER.set(1)
        log.info("became maintenance leader (epoch %s)", self.epoch)
        return True

    async def _lock(self) -> bool:
        """Take the advisory lock on the lock connection (opened if needed), displacing a
        frozen holder (docs/architecture.md, "the leader's fencing rule", 4)."""
        repo = LeaderRepo(await self._own_conn())
        key = self.binding.leader_lock_key
        if not await repo.try_lock(key):
            if not await repo.displace_frozen_leader(key, self.config.heartbeat_staleness_ms):
                return False
            log.warning(
                "displaced a frozen maintenance leader (its lock connection idle for "
                "more than heartbeat_staleness_ms=%s)",
                self.config.heartbeat_staleness_ms,
            )
            if not await repo.try_lock(key):
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
        repo, stale_ms = LeaderRepo(conn), self.config.heartbeat_staleness_ms
        for last in (False, True):
            try:
                async with conn.transaction():
                    await repo.limit_waits(wait_ms)  # a take frozen mid-way ends
                    return await repo.take_lease(holder, self.via_lock, stale_ms)
            except psycopg.errors.LockNotAvailable:
                if last:
                    raise
                if not await repo.displace_frozen_passes(stale_ms):
                    raise
                log.warning("terminated a frozen pass of the previous maintenance leader")
        raise AssertionError("unreachable")

    async def _own_conn(self) -> psycopg.AsyncConnection:
        """The election's own connection (opened if needed): the lock connection, or through a
        transaction pooler one without session state (a client connection the pooler gives a
        server connection per transaction). Its own, not the pool's: handlers holding every
        pool connection must not keep the leader from renewing its lease."""
        conn = self.lock_conn
        if conn is None or conn.closed:
            conn = self.lock_conn = await self._connection_class.connect(
                self.database_url, autocommit=True, **pooler_mode.connect_options(self.pooler)
            )
        return conn

    @contextlib.asynccontextmanager
    async def _lease_conn(self) -> AsyncIterator[psycopg.AsyncConnection]:
        """Where the leader renews and frees its lease: the connection it was elected on (a
        lost one fails the renewal: the leader steps down)."""
        if self.lock_conn is None or self.lock_conn.closed:
            raise psycopg.OperationalError("the leader's own connection is closed")
        yield self.lock_conn

    async def renew(self) -> bool:
        """Renew the lease at this process's epoch; False when the epoch moved on (deposed).

        Raises:
            psycopg.Error: the database failed, or the lease row stayed locked (a process
                taking the expired lease) for ``max(leader_election_interval_ms, 1 s)``.
        """
        wait_ms = max(self.config.leader_election_interval_ms, 1000)
        async with self._lease_conn() as conn:
            async with conn.transaction():
                repo = LeaderRepo(conn)
                # a renewal frozen mid-way (its host cut off) must not hold the lease row and
                # the lock connection for as long as its dead TCP connection stays open (ADR 039)
                await repo.limit_waits(wait_ms)
                return await repo.renew(self.epoch, self.config.heartbeat_staleness_ms)

    async def _release(self) -> None:
        """Free the lease held at this process's epoch (a stepping-down leader), bounded: the
        lease expires on its own."""
        try:
            async with asyncio.timeout(RELEASE_S):
                async with self._lease_conn() as conn:
                    await LeaderRepo(conn).release(self.epoch)
        except (Exception, TimeoutError) as exc:
            log.info("maintenance lease left to expire: %s: %s", type(exc).__name__, exc)

    async def close(self) -> None:
        """Close the election's own connection (a dead one too: it is gone either way)."""
        if self.lock_conn is not None:
            with contextlib.suppress(Exception):
                await self.lock_conn.close()
            self.lock_conn = None

    async def resign(self) -> bool:
        """Give up leadership: free the lease (bounded: it expires on its own) and close the
        election's connection. Returns whether this process was the leader."""
        was_leader = self.is_leader
        if was_leader:
            log.info("gave up maintenance leadership (epoch %s)", self.epoch)
        self.is_leader = False
        metrics.LEADER.set(0)
        if was_leader:
            await self._release()
        await self.close()
        return was_leader

    @contextlib.asynccontextmanager
    async def fenced(self, *, bounded: bool = False) -> AsyncIterator[psycopg.AsyncConnection]:
        """A pool connection inside a transaction that holds the leader row ``FOR SHARE`` at
        this process's epoch: the only way a leader pass writes. Nested ``conn.transaction()``
        blocks are savepoints. With ``bounded`` (the maintenance passes; not the extra tasks,
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
                repo = LeaderRepo(conn)
                if self.epoch is not None:  # never elected: a pass run by hand (tests, tools)
                    if not await repo.fence(self.epoch):
                        raise Deposed(f"epoch {self.epoch} is over: another process leads")
                if bounded:
                    # A pass never waits long on a row or table another session holds: the
                    # statement fails (logged; the pass goes on) instead of stalling the loop.
                    # Nor does it hold its own locks long if this process stops mid-pass.
                    await repo.bound_pass()
                yield conn
