"""What the leader passes share: their :class:`PassContext` and the statement helpers the
promote, rescue and prune passes run their row-isolated statements with (``bulk.run_isolated``).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

import psycopg

from awa_fast import bulk
from awa_fast.repo.maintenance import PassRepo
from awa_fast.worker.maintenance.config import MaintenanceConfig

log = logging.getLogger("awa_fast.maintenance")


@dataclasses.dataclass
class PassContext:
    """The state every leader pass of one process reads and updates.

    Attributes:
        config: intervals, batch sizes, retention.
        pool_getter: awaited, gives the client's connection pool (reads, NOTIFYs).
        fenced: ``fenced(bounded=True)``: a pool connection in a transaction fenced at this
            process's epoch (``Leadership.fenced``), the only way a pass writes.
        counts: totals since start: ``promoted``, ``rescued``, ``pruned``, ``hot_vacuums``,
            ``hot_truncations``.
        recurring: one :class:`bulk.Recurring` per kind of pass (``what``): a row a pass cannot
            process fails the same way every pass, and is warned about once.
    """

    config: MaintenanceConfig
    pool_getter: Callable
    fenced: Callable[..., AbstractAsyncContextManager[psycopg.AsyncConnection]]
    counts: dict[str, int] = dataclasses.field(
        default_factory=lambda: dict.fromkeys(
            ("promoted", "rescued", "pruned", "hot_vacuums", "hot_truncations"), 0
        )
    )
    recurring: collections.defaultdict[str, bulk.Recurring] = dataclasses.field(
        default_factory=lambda: collections.defaultdict(bulk.Recurring)
    )


async def fetch(conn, query: str, params) -> list[tuple]:
    return await PassRepo(conn).rows(query, params)


async def fetch_ids(conn, query: str, params: dict) -> list[int]:
    return await PassRepo(conn).ids(query, params)


async def fetch_id(conn, query: str, params: dict, job_id: int) -> list[tuple]:
    return await fetch(conn, query, {**params, "id": job_id})


async def cancel_duplicate(conn, query: str, params: dict) -> None:
    """Cancel job ``params["id"]`` whose new state would take a unique key another job holds
    (``query``: the pass's cancel statement), logged when it did."""
    if await PassRepo(conn).run(query, params):
        log.warning(
            "job %s cancelled as a duplicate: its new state would take a unique "
            "key another job holds",
            params["id"],
        )
