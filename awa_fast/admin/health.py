"""Health (awa-pg's ``health_check``): :class:`HealthAdmin`, :class:`HealthCheck` and
:class:`QueueHealth`."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from awa_fast.admin.area import Area
from awa_fast.connections import ADMIN_POOL_WAIT_S, Connections
from awa_fast.repo.queues import QueueRepo

if TYPE_CHECKING:
    from awa_fast.worker.runtime import Runtime

log = logging.getLogger("awa_fast.admin")


@dataclasses.dataclass(frozen=True)
class QueueHealth:
    """One queue this process works: attempts running here, its worker limit, and the
    ``available`` jobs waiting in the database."""

    queue: str
    in_flight: int
    max_workers: int
    available: int


@dataclasses.dataclass(frozen=True)
class HealthCheck:
    """``healthy`` = postgres reachable and, when this client runs a runtime, every dispatcher
    loop and the heartbeat loop alive and not shutting down, and -- on the maintenance leader --
    no leader loop dead, and this process's leader election not failing with an error attempt
    after attempt (``election_error``: its latest error, else ``None``; another process
    leading is no error). ``maintenance_loops`` maps each leader loop's name to its
    :class:`~awa_fast.worker.maintenance.LoopHealth` (``alive``, ``passes``, ``failures``,
    ``last_error``, ``stuck_rows``: rows its passes left unchanged and remember, not a failure); it is empty on a non-leader. Without a runtime only postgres is checked
    (the loop fields are then ``False`` and ``queues`` is empty)."""

    healthy: bool
    postgres_connected: bool
    poll_loop_alive: bool
    heartbeat_alive: bool
    shutting_down: bool
    leader: bool
    queues: dict[str, QueueHealth]
    maintenance_loops: dict = dataclasses.field(default_factory=dict)
    election_error: str | None = None


class HealthAdmin(Area):
    """Builds :class:`HealthCheck` reports.

    Args:
        db: the connection source.
        runtime: returns the runtime this client runs in this process, or ``None``.
    """

    def __init__(self, db: Connections, runtime: Callable[[], Runtime | None]) -> None:
        super().__init__(db)
        self._runtime = runtime

    async def health_check(self) -> HealthCheck:
        """Postgres reachability plus, when this client runs a runtime, its loops, leadership
        and per-queue load (see :class:`HealthCheck`). Never raises for an unreachable database:
        it answers ``postgres_connected=False`` after at most ``ADMIN_POOL_WAIT_S`` seconds (3)
        waiting for a connection, not the pool's 30 s, also while the pool is first opened.
        """
        available: dict[str, int] = {}
        runtime = self._runtime()
        names = list(runtime.dispatchers) if runtime is not None else []
        try:
            async with self._db.connection(timeout=ADMIN_POOL_WAIT_S) as conn:
                available = await QueueRepo(conn).available(names)
            connected = True
        except Exception as exc:  # any failure to reach postgres means "not connected"
            log.warning("health check: postgres unreachable: %s", exc)
            connected = False
        if runtime is None:
            return HealthCheck(connected, connected, False, False, False, False, {})
        tasks = {t.get_name(): t for t in getattr(runtime, "_tasks", [])}
        dispatch = [t for n, t in tasks.items() if n.startswith("awa-dispatch-")]
        poll_alive = bool(dispatch) and all(not t.done() for t in dispatch)
        liveness = getattr(runtime, "liveness", None)
        heartbeat_alive = liveness is not None and liveness.beating
        shutting_down = any(getattr(d, "_stopping", False) for d in runtime.dispatchers.values())
        leader = bool(runtime.maintenance is not None and runtime.maintenance.is_leader)
        running: dict[str, int] = {}
        for ctx in list(runtime.in_flight.values()):
            running[ctx.queue] = running.get(ctx.queue, 0) + 1
        queues = {
            name: QueueHealth(name, running.get(name, 0), d.max_workers, available.get(name, 0))
            for name, d in runtime.dispatchers.items()
        }
        maintenance = runtime.maintenance
        loops = maintenance.loop_health() if maintenance is not None else {}
        healthy = (
            connected
            and poll_alive
            and heartbeat_alive
            and not shutting_down
            and all(h.alive for h in loops.values())
            and not (maintenance is not None and maintenance.election_failing)
        )
        return HealthCheck(
            healthy,
            connected,
            poll_alive,
            heartbeat_alive,
            shutting_down,
            leader,
            queues,
            loops,
            maintenance.election_error if maintenance is not None else None,
        )
