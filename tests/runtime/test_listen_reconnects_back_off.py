"""A lost LISTEN connection is reconnected with a doubling back-off."""

from __future__ import annotations

import dataclasses

import psycopg
import pytest

from tests import support
from tests.support import poll_until

# The shared timing (tests/support.py) with this module's differences.
FAST = {**support.FAST, "maintenance": False}

pytestmark = pytest.mark.usefixtures("clean", "no_presence_rows")


@dataclasses.dataclass
class Job:
    mode: str = ""


# Issue 9, class 3: the LISTEN loop retried a lost connection every poll interval without backing
# off (about 20 WARNING lines a second at poll_interval_ms=50 while the database refused
# connections), unlike every other loop (interval * 2^(failures-1), at most 30 s).


async def test_listen_reconnects_back_off(dsn, client, caplog):
    import logging
    import re

    client.task(Job)(lambda job: None)
    await client.start([("default", 1)], **FAST)
    dbname = psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]
    pid = client.runtime.listener.conn.info.backend_pid
    caplog.set_level(logging.WARNING, logger="awa_fast.runtime")

    def delays():
        return [
            float(m.group(1))
            for r in caplog.records
            if (
                m := re.search(
                    r"LISTEN connection lost .*reconnecting in ([0-9.]+) s", r.getMessage(), re.S
                )
            )
        ]

    admin = psycopg.conninfo.make_conninfo(dsn, dbname="postgres")
    async with await psycopg.AsyncConnection.connect(admin, autocommit=True) as conn:
        await conn.execute(f'ALTER DATABASE "{dbname}" WITH ALLOW_CONNECTIONS false')
        try:
            await conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
            # polled: the listen loop's failed reconnects show only in its log records
            await poll_until(
                lambda: _true(len(delays()) >= 4), timeout=10, what="four failed LISTEN reconnects"
            )
        finally:
            await conn.execute(f'ALTER DATABASE "{dbname}" WITH ALLOW_CONNECTIONS true')
    assert delays()[:4] == [0.05, 0.1, 0.2, 0.4]  # poll_interval_ms=50, doubling


async def _true(value):
    return value
