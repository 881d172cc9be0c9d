"""The application run by ``awa-fast worker tests.launcher_app:client`` in the launcher tests.

Database: ``$AWA_FAST_LAUNCHER_DSN``. ``$AWA_FAST_LAUNCHER_FAIL`` = ``import`` or ``start`` makes
every child die at import or in ``client.start()`` (a crash loop).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os

import awa_fast as awa

if os.environ.get("AWA_FAST_LAUNCHER_FAIL") == "import":
    raise RuntimeError("launcher_app: failing at import on purpose")

client = awa.AsyncClient(os.environ.get("AWA_FAST_LAUNCHER_DSN", ""), max_connections=4)

# Passed by the launcher to client.start(): fast polling, heartbeats, rescue and election.
START_OPTIONS = dict(poll_interval_ms=50, heartbeat_interval_ms=100, heartbeat_staleness_ms=1000,
                     heartbeat_rescue_interval_ms=200, deadline_rescue_interval_ms=200,
                     callback_rescue_interval_ms=200,
                     promote_interval_ms=50, leader_election_interval_ms=200)

if os.environ.get("AWA_FAST_LAUNCHER_FAIL") == "start":
    START_OPTIONS["no_such_option"] = 1  # start() raises TypeError


@dataclasses.dataclass
class Nap:
    """Sleep ``ms`` milliseconds."""

    ms: int


@client.task(Nap, queue="launch_q")
async def nap(job):
    await asyncio.sleep(job.args.ms / 1000)
