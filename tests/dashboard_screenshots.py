"""Make the dashboard screenshots in docs/dashboard/ (run once by hand, PNGs committed):

    python -m tests.dashboard_screenshots docs/dashboard

Starts a throwaway PostgreSQL, seeds it as the tests do (tests/dashboard_seed.py) plus a few
hundred orders and some long-running jobs, keeps a worker running (so the leader and running
attempts show), serves the dashboard and photographs each page with Debian's chromium.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from playwright.async_api import async_playwright

import awa_fast as awa
from awa_fast.embedded import start_temp
from awa_fast.schema import migrate_sync
from tests import dashboard_seed
from tests.dashboard_support import CHROMIUM, CHROMIUM_ARGS, served
from tests.support import scalar, until


@dataclasses.dataclass
class RenderVideo:
    video: int


async def _shoot(base: str, out: Path, ids: dict[str, int]) -> list[str]:
    pages = [
        ("queues", "/queues"),
        ("jobs", "/jobs"),
        ("jobs-failed", "/jobs?state=failed"),
        ("job-failed", f"/jobs/{ids['boom']}"),
        ("job-lineage", f"/jobs/{ids['ship']}"),
        ("dlq", "/dlq"),
        ("consequences", "/consequences"),
        ("cron", "/cron"),
        ("workers", "/workers"),
    ]
    written = []
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = await browser.new_page(viewport={"width": 1440, "height": 900})
        for name, path in pages:
            await page.goto(base + path)
            target = out / f"{name}.png"
            await page.screenshot(path=str(target), full_page=name != "jobs")
            written.append(str(target))
        await browser.close()
    return written


async def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    server = start_temp()
    try:
        dsn = server.dsn
        migrate_sync(dsn)
        ids = await dashboard_seed.seed(dsn)
        client = awa.AsyncClient(dsn)
        dashboard_seed.register(client)

        @client.task(RenderVideo, queue="media", failure_consequence=awa.NO_FAILURE_CONSEQUENCE)
        async def render_video(job):
            job.set_progress(35, "encoding 1080p")
            await asyncio.sleep(3600)

        await client.insert_many([dashboard_seed.PlaceOrder(n) for n in range(2000, 2400)])
        await client.insert_many([RenderVideo(n) for n in range(6)], queue="media")
        await client.insert_many(
            [dashboard_seed.SendInvoice(n) for n in range(3)], queue="billing", max_attempts=1
        )
        await client.pause_queue("reports", paused_by="ops")
        await client.insert_many(
            [dashboard_seed.NightlyReport() for _ in range(12)], queue="reports"
        )
        await client.start(
            [
                ("default", 8),
                ("shipping", 4),
                ("media", 2),
                {"name": "billing", "max_workers": 2, "dlq": True},
            ],
            **dashboard_seed.FAST,
        )
        try:
            await until(
                lambda: scalar(
                    dsn,
                    "SELECT count(*) = 0 FROM awa_fast.jobs_all WHERE "
                    "state = 'available' AND queue IN ('default', "
                    "'shipping')",
                ),
                client,
                60,
                "the orders to drain",
            )
            await until(
                lambda: scalar(
                    dsn,
                    "SELECT count(*) = 2 FROM awa_fast.jobs_all WHERE "
                    "state = 'running' AND progress IS NOT NULL",
                ),
                [client, client.runtime.heartbeat.beaten],
                30,
                "two videos running with progress",
            )
            await until(
                lambda: scalar(dsn, "SELECT count(*) >= 4 FROM awa_fast.dlq"),
                client,
                30,
                "the DLQ entries",
            )
            # the newest rows: a mix of kinds, queues and waiting states for the jobs page
            later = datetime.now(UTC) + timedelta(hours=2)
            for n in range(8):
                await client.insert(dashboard_seed.PlaceOrder(3000 + n), run_at=later)
                await client.insert(dashboard_seed.NightlyReport(), queue="reports")
                await client.insert(RenderVideo(100 + n), queue="media")
            with served(dsn) as base:
                for path in await _shoot(base, out, ids):
                    print(path)
        finally:
            await client.shutdown(timeout_ms=500)
            await client.close()
    finally:
        server.stop()


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/dashboard")))
