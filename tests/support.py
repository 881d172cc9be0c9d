"""Shared helpers for the integration tests (real PostgreSQL, no mocks)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import struct
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import psycopg

from awa_fast.worker.observe import Signal

# The one timing of every runtime a test starts in its own process: claims every 50 ms, every
# maintenance loop every 50-100 ms (heartbeat staleness and the rest stay at their defaults).
# A module that needs more gives its differences on top: ``{**FAST, "maintenance": False}``.
FAST: dict[str, Any] = dict(
    poll_interval_ms=50,
    heartbeat_interval_ms=100,
    promote_interval_ms=50,
    leader_election_interval_ms=100,
    heartbeat_rescue_interval_ms=50,
    callback_rescue_interval_ms=50,
    deadline_rescue_interval_ms=50,
    reconcile_interval_ms=50,
    cron_interval_ms=50,
    callback_poll_interval_ms=20,
)

Source = Any  # a started AsyncClient, a Runtime, a Signal, or a list / tuple of them


@dataclasses.dataclass
class Job:
    """The args of the fault tests' jobs (kind ``job``): ``mode`` picks the handler's
    behaviour, ``n`` tells jobs apart."""

    mode: str = ""
    n: int = 0


def signals(source: Source) -> list[Signal]:
    """The signals a wait on ``source`` wakes on: a client's or runtime's ``progress`` (claims
    that took rows, attempts ended, maintenance passes that did work), or the signal itself."""
    if isinstance(source, Signal):
        return [source]
    if isinstance(source, (list, tuple)):
        return [s for item in source for s in signals(item)]
    runtime = getattr(source, "runtime", source)
    progress = getattr(runtime, "progress", None)
    if not isinstance(progress, Signal):
        raise TypeError(f"{source!r} has no signals to wait on (is the client started?)")
    return [progress]


def passes(source: Any, loop: str) -> Signal:
    """A signal fired after each pass of the maintenance loop named ``loop`` (``"promote"``,
    ``"rescue"``, ``"callback_rescue"``, ``"prune"``, ``"evaluate_cron"``, ``"reconcile"``,
    ``"run_batch_operations"``) of a started client's (or runtime's) leader, whatever it did."""
    runtime = getattr(source, "runtime", source)
    signal = Signal(f"{loop} pass")
    runtime.maintenance.passed.subscribe(
        lambda step: signal.fire(step[1]) if step[0] == loop else None
    )
    return signal


async def until(
    predicate: Callable[[], Any],
    source: Source,
    timeout: float = 15.0,
    what: str = "condition",
) -> Any:
    """Evaluate ``predicate`` (a plain or async callable) now and again after each step of
    ``source`` (see :func:`signals`) until it returns a truthy value, which is returned.
    No database polling: the predicate runs once per step that may have changed something.
    A step fired between an evaluation and the wait after it is never missed.

    Raises:
        AssertionError: ``timeout`` seconds passed first.
    """
    watched = signals(source)

    async def loop() -> Any:
        while True:
            seen = [s.count for s in watched]
            value = predicate()
            if asyncio.iscoroutine(value) or isinstance(value, asyncio.Future):
                value = await value
            if value:
                return value
            waits = [asyncio.ensure_future(s.after(n)) for s, n in zip(watched, seen)]
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()

    try:
        return await asyncio.wait_for(loop(), timeout)
    except TimeoutError:
        raise AssertionError(f"timed out after {timeout}s waiting for {what}") from None


async def poll_until(
    predicate: Callable[[], Awaitable[Any]], timeout: float = 15.0, what: str = "condition"
) -> Any:
    """Poll ``predicate`` (an async callable) every 20 ms until it returns a truthy value.

    Only for what no signal of this process reports: a change made by another process (a
    launcher child, a worker subprocess, a killed process's server-side effects) or server
    state such as a statement waiting on a lock. Each caller says which in a comment.

    Raises:
        AssertionError: ``timeout`` seconds passed first.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = await predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)


async def wait_lock_waiter(
    dsn: str,
    *,
    query_like: str | None = None,
    pid: int | None = None,
    timeout: float = 10.0,
    what: str = "a statement waiting on a lock",
) -> None:
    """Wait until a backend of ``dsn``'s database waits on a lock (its query ``LIKE
    query_like`` / its backend ``pid``, when given). Polled (:func:`poll_until`): a lock wait
    is server state that no signal of this process reports."""

    async def waiting() -> bool:
        return await scalar(
            dsn,
            "SELECT count(*) > 0 FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND (%(like)s::text IS NULL OR query LIKE %(like)s) "
            "AND (%(pid)s::int IS NULL OR pid = %(pid)s)",
            {"like": query_like, "pid": pid},
        )

    await poll_until(waiting, timeout, what)


async def job_row(dsn: str, job_id: int) -> dict:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = conn.cursor(row_factory=psycopg.rows.dict_row)
        await cur.execute("SELECT * FROM awa_fast.jobs_all WHERE id = %s", (job_id,))
        return await cur.fetchone()


def _dsn(source: Source) -> str:
    first = source[0] if isinstance(source, (list, tuple)) else source
    runtime = getattr(first, "runtime", first)
    client = getattr(runtime, "client", first)
    return client.database_url


async def wait_state(source: Source, job_id: int, *states: str, timeout: float = 15.0) -> dict:
    """Wait until job ``job_id`` is in one of ``states``, re-reading its row after each step
    of ``source`` (a started client, or several: the first one's database); returns the row."""
    dsn = _dsn(source)

    async def check() -> dict | None:
        row = await job_row(dsn, job_id)
        return row if row and row["state"] in states else None

    return await until(check, source, timeout, f"job {job_id} in {states}")


async def poll_state(dsn: str, job_id: int, *states: str, timeout: float = 15.0) -> dict:
    """:func:`wait_state` for a job that another process moves (see :func:`poll_until`)."""

    async def check() -> dict | None:
        row = await job_row(dsn, job_id)
        return row if row and row["state"] in states else None

    return await poll_until(check, timeout, f"job {job_id} in {states}")


class Recorder(list):
    """A list a handler appends to, with a signal fired per append, so a test waits for the
    handler (``await started.until(lambda: len(started) == 3)``) instead of polling."""

    def __init__(self, items: Iterable[Any] = ()) -> None:
        super().__init__(items)
        self.appended = Signal("appended")
        self._loop: asyncio.AbstractEventLoop | None = None

    def append(self, item: Any) -> None:
        super().append(item)
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # a ``def`` handler's thread: fire on the waiting loop
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self.appended.fire, item)
            return
        self.appended.fire(item)

    async def until(
        self, predicate: Callable[[], Any], timeout: float = 15.0, what: str = "condition"
    ) -> Any:
        """:func:`until` on this recorder's appends."""
        self._loop = asyncio.get_running_loop()
        return await until(predicate, self.appended, timeout, what)


async def scalar(dsn: str, query: str, params: Any = None) -> Any:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        cur = await conn.execute(query, params)
        return (await cur.fetchone())[0]


async def truncate(dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(
            "TRUNCATE awa_fast.jobs, awa_fast.queue_meta, awa_fast.dlq, "
            "awa_fast.callback_expressions, awa_fast.queue_descriptors, "
            "awa_fast.job_kind_descriptors, awa_fast.batch_operations, awa_fast.verifier_kinds "
            "CASCADE"
        )


@contextlib.asynccontextmanager
async def failing_rows(
    dsn: str,
    when: str,
    *,
    event: str = "INSERT",
    table: str = "awa_fast.jobs",
    name: str = "explode",
):
    """A trigger added outside awa-fast that fails every ``event`` (INSERT / UPDATE) of a row
    of ``table`` matching ``when`` (an SQL condition over NEW/OLD), as an unpredictable
    per-row error would (ADR-046's example); removed afterwards."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(f"""
            CREATE OR REPLACE FUNCTION public.{name}() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN RAISE EXCEPTION 'trigger added outside awa-fast'; END $$;
            DROP TRIGGER IF EXISTS {name} ON {table};
            CREATE TRIGGER {name} BEFORE {event} ON {table} FOR EACH ROW
                WHEN ({when}) EXECUTE FUNCTION public.{name}();""")
    try:
        yield
    finally:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            await conn.execute(f"DROP TRIGGER {name} ON {table}; DROP FUNCTION public.{name}()")


def exploding_inserts(dsn: str, kind: str = "explode"):
    """:func:`failing_rows` for every insert of ``kind`` into ``awa_fast.jobs``."""
    return failing_rows(dsn, f"NEW.kind = '{kind}'")


@contextlib.contextmanager
def running_bouncer(server_dsn: str, pool_mode: str = "transaction", **options):
    """A PgBouncer of the test's own in front of ``server_dsn``'s server (bench/pgbouncer.py,
    ``options`` its keywords), stopped afterwards. A missing pgbouncer fails the test (never a
    skip: ``.ci/run`` installs it)."""
    import pytest

    from bench import pgbouncer

    try:
        with pgbouncer.running(server_dsn, pool_mode, **options) as b:
            yield b
    except pgbouncer.PgBouncerError as exc:
        pytest.fail(f"{exc} (.ci/run installs it)")


def sigint_as_at_a_terminal() -> None:
    """``preexec_fn`` for a child a test interrupts with SIGINT: the default disposition, as
    under an interactive shell. A suite started in the background (``cmd &`` without job
    control) inherits SIGINT ignored, and Python keeps an ignored SIGINT ignored."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


async def wakeups_until_marker(listener: Any, dsn: str, marker: str) -> list[str]:
    """The payloads on channel awa_fast that ``listener`` (a connection that ran ``LISTEN
    awa_fast``) receives up to ``marker``, which this sends last from another connection:
    notifications arrive in commit order, so what is not before it was never sent."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as other:
        await other.execute("SELECT pg_notify('awa_fast', %s)", (marker,))
    seen = []
    async for note in listener.notifies():
        if note.channel == "awa_fast":
            if note.payload == marker:
                return seen
            seen.append(note.payload)
    return seen


class Proxy:
    """A TCP proxy to the server of ``dsn`` (:attr:`dsn` goes through it), for a network fault:
    :meth:`cut` closes every connection through it and holds each new one (accepted, read, never
    answered: a network that drops the packets); :meth:`heal` forwards new ones again;
    :meth:`refuse` resets new ones at once (a database that refuses connections). Use as a
    context manager."""

    def __init__(self, dsn: str) -> None:
        from psycopg.conninfo import conninfo_to_dict, make_conninfo

        info = conninfo_to_dict(dsn)
        self._upstream = (str(info.get("host") or "127.0.0.1"), int(info.get("port") or 5432))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.dsn = make_conninfo(dsn, host="127.0.0.1", port=str(self._listener.getsockname()[1]))
        self._lock = threading.Lock()
        self._piped: list[socket.socket] = []
        self._held: set[socket.socket] = set()
        self._cut = False
        self._passes = 0  # connections still forwarded before the refused ones
        self._refusals = 0
        self.refused = 0  # connections reset by refuse()
        threading.Thread(target=self._accept, daemon=True).start()

    def refuse(self, n: int, *, after: int = 0) -> None:
        """Forward the next ``after`` new connections, then reset the ``n`` after them at once
        (TCP RST, before the server says anything), then forward again."""
        with self._lock:
            self._passes, self._refusals = after, n

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                if self._passes:
                    self._passes -= 1
                elif self._refusals:
                    self._refusals -= 1
                    self.refused += 1
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    sock.close()
                    continue
                if self._cut:
                    self._held.add(sock)
                    threading.Thread(target=self._hold, args=(sock,), daemon=True).start()
                    continue
                upstream = socket.create_connection(self._upstream)
                self._piped += [sock, upstream]
            for a, b in ((sock, upstream), (upstream, sock)):
                threading.Thread(target=pipe, args=(a, b), daemon=True).start()

    def _hold(self, sock: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while sock.recv(65536):  # until the client gives up
                pass
        with self._lock:
            self._held.discard(sock)
        sock.close()

    def cut(self) -> None:
        with self._lock:
            self._cut = True
            piped, self._piped = self._piped, []
        for sock in piped:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # wakes its pipe thread, which closes the pair

    def heal(self) -> None:
        with self._lock:
            self._cut = False

    def __enter__(self) -> Proxy:
        return self

    def __exit__(self, *exc) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes accept(); close() alone does not
        self._listener.close()
        self.cut()
        with self._lock:
            held = list(self._held)
        for sock in held:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


def pipe(src: socket.socket, dst: socket.socket) -> None:
    """Copy ``src`` to ``dst`` until either closes (a proxy's one direction)."""
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_RDWR)
        dst.close()
