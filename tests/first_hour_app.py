"""The application of tests/cli/test_first_hour.py: a client built without a URL (it resolves
``$AWA_FAST_DATABASE_URL`` / ``$DATABASE_URL`` / the embedded server like the CLI)."""

from __future__ import annotations

import asyncio
import dataclasses

import awa_fast as awa

client = awa.AsyncClient(max_connections=4)
START_OPTIONS = dict(poll_interval_ms=50, leader_election_interval_ms=200)


@dataclasses.dataclass
class Ping:
    n: int


@dataclasses.dataclass
class Pay:
    cents: int


@client.task(Ping, queue="fh_q", failure_consequence=awa.NO_FAILURE_CONSEQUENCE)
async def ping(job):
    return None


@client.task(Pay, queue="fh_pay", failure_consequence=awa.NO_FAILURE_CONSEQUENCE)
async def pay(job):
    return None


@dataclasses.dataclass
class Stall:
    """A handler that never ends on its own (the drain timeout gives its attempt back)."""

    n: int


@client.task(Stall, queue="fh_stall", failure_consequence=awa.NO_FAILURE_CONSEQUENCE)
async def stall(job):
    await asyncio.Event().wait()


@dataclasses.dataclass
class Boom:
    n: int


@client.task(Boom, queue="fh_stall", failure_consequence=awa.NO_FAILURE_CONSEQUENCE)
async def boom(job):
    raise RuntimeError("boom on purpose")
