"""Every metrics series is exported at 0 from the start, not only once first counted: a
dashboard's ``rate()`` or an alert on ``rescues_total`` needs the series before the first rescue.
Scraped before any job ran: a library runtime's own endpoint, and the launcher's aggregate of
its children (prometheus_client's multiprocess files)."""

from __future__ import annotations

import asyncio
import dataclasses
import signal

import awa_fast as awa
from awa_fast import metrics
from tests.runtime.test_launcher import Launcher, clean, launchers, poll  # noqa: F401 - fixtures
from tests.runtime.test_metrics import scrape

STARTED = "zero_q"


@dataclasses.dataclass
class ZeroWork:
    n: int


@dataclasses.dataclass
class ZeroOwe:
    n: int


def _expected(queue: str, kinds: list[str], consequence_kinds: list[str]) -> list[tuple]:
    """The samples a runtime on ``queue`` with handlers ``kinds`` exports before any count."""
    out: list[tuple] = [
        ("awa_fast_rescues_total", (("cause", cause),))
        for cause in ("heartbeat", "deadline", "callback")
    ]
    out += [
        ("awa_fast_follow_ups_discarded_total", (("outcome", outcome),))
        for outcome in metrics.DISCARD_OUTCOMES
    ]
    out += [
        ("awa_fast_jobs_finalized_total", (("kind", kind), ("outcome", outcome), ("queue", queue)))
        for kind in kinds
        for outcome in metrics.FINALIZE_OUTCOMES
    ]
    out += [("awa_fast_consequences_applied_total", (("kind", k),)) for k in consequence_kinds]
    out += [
        ("awa_fast_claim_seconds_count", (("queue", queue),)),
        ("awa_fast_finalize_seconds_count", (("queue", queue),)),
        ("awa_fast_follow_ups_inserted_total", ()),
        ("awa_fast_follow_ups_skipped_total", ()),
        ("awa_fast_staged_discarded_on_wait_for_callback_total", ()),
    ]
    out += [
        ("awa_fast_maintenance_stuck_rows", (("loop", loop),))
        for loop in ("promote", "rescue", "callback_rescue", "prune")
    ]
    return out


async def test_a_library_runtime_exports_every_series_at_zero_before_any_job(dsn, client):
    async def refund(failure: awa.JobFailure) -> None:
        pass

    @client.task(ZeroWork, queue=STARTED, failure_consequence=awa.NO_FAILURE_CONSEQUENCE)
    async def work(job):
        pass

    @client.task(ZeroOwe, queue=STARTED, failure_consequence=refund)
    async def owe(job):
        pass

    await client.start([(STARTED, 1)], metrics_port=0, leader_election_interval_ms=100)
    try:
        samples = await asyncio.to_thread(scrape, client.runtime.metrics_exporter.url)
    finally:
        await client.shutdown()
    kinds = ["zero_work", "zero_owe"]
    missing = [key for key in _expected(STARTED, kinds, ["zero_owe"]) if key not in samples]
    assert not missing, missing
    for key in _expected(STARTED, kinds, ["zero_owe"]):
        mine = dict(key[1]).get("queue") == STARTED or dict(key[1]).get("kind") in kinds
        if mine and key[0].endswith("_total"):
            assert samples[key] == 0, key  # this test's own counters: nothing counted yet


def test_the_launchers_endpoint_exports_every_series_at_zero_before_any_job(dsn, launchers):
    launcher = Launcher(
        dsn, "--processes", "2", "--metrics-port", "0", app="tests.metrics_app:client"
    )
    launchers.append(launcher)
    url = launcher.wait_line(r"metrics of all children at (\S+) ")[1]
    launcher.ready_pids(2)
    samples = scrape(url)
    expected = _expected("metrics_q", ["step", "charge"], ["charge"])
    missing = [key for key in expected if key not in samples]
    assert not missing, missing
    # nothing was counted (a claim that found nothing is observed: histograms only present)
    counted = {k: samples[k] for k in expected if k[0].endswith("_total") and samples[k] != 0}
    assert not counted, counted
    launcher.proc.send_signal(signal.SIGTERM)
    assert launcher.wait(60) == 0, launcher.transcript()
