"""The application run by ``awa-fast worker tests.launcher_app:client`` in the launcher tests.

Database: ``$AWA_FAST_LAUNCHER_DSN``. ``$AWA_FAST_LAUNCHER_FAIL``:

- ``import``: importing the module raises (the launcher's preflight reports it);
- ``child-import``: importing raises in the worker children only (not in the preflight);
- ``config``: ``START_OPTIONS`` that ``start()`` rejects with ``ConfigError`` (the preflight
  reports it);
- ``queues``: ``START_OPTIONS`` gives ``queues`` (the launcher passes them: ``--queues``);
- ``start``: ``client.start()`` raises TypeError in the worker children only (a crash loop: the
  preflight cannot see it);
- ``exit``: the module calls ``sys.exit(0)`` at import;
- ``stdout``: the module writes to stdout at import (no newline) and at exit;
- ``hostile-stdout``: it writes bytes that are not UTF-8 and look-alike result lines, and
  points ``sys.stdout`` at stderr;
- ``spawn-at-import``: a worker child starts a process at import, which writes the value of
  ``$AWA_FAST_CHILD_DATABASE_URL`` it sees to the file ``$AWA_FAST_LAUNCHER_PROBE``;
- ``slow-child-import``: importing takes 3 s in the worker children.

An empty ``$AWA_FAST_LAUNCHER_DSN`` leaves the client without a URL (``$DATABASE_URL`` then).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sys
import time

import awa_fast as awa

FAIL = os.environ.get("AWA_FAST_LAUNCHER_FAIL")
IN_CHILD = "--child" in sys.argv  # a worker child, not the launcher's preflight (--check)

if FAIL == "import" or (FAIL == "child-import" and IN_CHILD):
    raise RuntimeError("launcher_app: failing at import on purpose")
if FAIL == "exit":
    sys.exit(0)
if FAIL == "stdout":  # an application that writes to stdout: without a newline, and at exit
    import atexit

    sys.stdout.write("launcher_app says hello")
    atexit.register(print, "launcher_app says goodbye")
if FAIL == "hostile-stdout" and not IN_CHILD:  # the preflight: bytes that are not UTF-8,
    # look-alike result lines, stdout moved
    import atexit

    sys.stdout.buffer.write(b"\xff\xfe not UTF-8\nawa-fast-preflight: {not json\n")
    sys.stdout.flush()
    atexit.register(print, 'awa-fast-preflight: {"explicit_url": "no"}', file=sys.__stdout__)
    sys.stdout = sys.stderr
if FAIL == "spawn-at-import" and IN_CHILD:  # a process the application starts at import
    import subprocess

    subprocess.run(
        [sys.executable, "-c", "import os; print(os.environ.get('AWA_FAST_CHILD_DATABASE_URL'))"],
        stdout=open(os.environ["AWA_FAST_LAUNCHER_PROBE"], "w"),
        check=True,
    )
if FAIL == "slow-child-import" and IN_CHILD:
    time.sleep(3)  # a slow import: the launcher is stopped meanwhile

client = awa.AsyncClient(os.environ.get("AWA_FAST_LAUNCHER_DSN", ""), max_connections=4)

# Passed by the launcher to client.start(): fast polling, heartbeats, rescue and election.
START_OPTIONS = dict(
    poll_interval_ms=50,
    heartbeat_interval_ms=100,
    heartbeat_staleness_ms=1000,
    heartbeat_rescue_interval_ms=200,
    deadline_rescue_interval_ms=200,
    callback_rescue_interval_ms=200,
    promote_interval_ms=50,
    leader_election_interval_ms=200,
)

if FAIL == "start" and IN_CHILD:
    START_OPTIONS["no_such_option"] = 1  # start() raises TypeError
if FAIL == "config":
    START_OPTIONS["heartbeat_interval_ms"] = 900  # above half of heartbeat_staleness_ms
if FAIL == "queues":
    START_OPTIONS["queues"] = [("default", 2)]


@dataclasses.dataclass
class Nap:
    """Sleep ``ms`` milliseconds."""

    ms: int


@client.task(Nap, queue="launch_q")
async def nap(job):
    await asyncio.sleep(job.args.ms / 1000)


@dataclasses.dataclass
class DefNap:
    """Sleep ``ms`` milliseconds in a plain ``def`` handler (a thread nothing can stop)."""

    ms: int


@client.task(DefNap, queue="launch_q")
def def_nap(job):
    time.sleep(job.args.ms / 1000)
