"""An application whose client names its schema (``tenant_app``), run by
``awa-fast --schema s worker tests.schema_app:client`` in tests/deploy/test_schemas.py: the launcher's
``--schema`` moves it, as ``--database-url`` overrides its URL. Database:
``$AWA_FAST_LAUNCHER_DSN``."""

from __future__ import annotations

import os

import awa_fast as awa
from tests.launcher_app import Nap

client = awa.AsyncClient(
    os.environ.get("AWA_FAST_LAUNCHER_DSN", ""), max_connections=4, schema="tenant_app"
)


@client.task(Nap, queue="launch_q")
async def nap(job):
    return None


START_OPTIONS = dict(poll_interval_ms=50, heartbeat_interval_ms=100)
