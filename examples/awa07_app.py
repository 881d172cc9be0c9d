"""An awa 0.7 application, configured the way awa's documentation configures one (its Python
getting-started guide and configuration reference), moved to awa-fast by changing one import.

Run: ``DATABASE_URL=postgres://... python examples/awa07_app.py`` (migrates the database, runs
two queues for a few jobs, prints each job's final state and exits 0). ``tests/cli/test_examples.py``
runs it in CI.
"""

import asyncio
import os
from dataclasses import dataclass

import awa_fast as awa  # the one line that differs from the awa application: `import awa`

DATABASE_URL = os.environ["DATABASE_URL"]


@dataclass
class SendEmail:
    to: str
    subject: str


@dataclass
class BuildReport:
    name: str


async def main() -> None:
    client = awa.AsyncClient(DATABASE_URL)
    await client.migrate()
    sent: list[str] = []

    @client.task(SendEmail, queue="email")
    async def handle_email(job):
        sent.append(job.args.to)

    @client.task(BuildReport, queue="reports")
    async def build_report(job):
        job.set_progress(100, "built")

    # The dict form of the configuration reference, with awa 0.7's queue-storage options as
    # its queue-storage section shows them.
    await client.start(
        [
            {"name": "email", "max_workers": 10, "rate_limit": (50.0, 50)},
            {
                "name": "reports",
                "max_workers": 5,
                "deadline_duration_ms": 600_000,
                "priority_aging_interval_ms": 30_000,
                "retention": {"completed_hours": 12, "failed_hours": 168},
            },
        ],
        queue_storage_schema="awa",
        queue_storage_queue_slot_count=16,
        queue_storage_lease_slot_count=8,
        queue_storage_claim_slot_count=8,
        queue_storage_queue_stripe_count=1,
        queue_storage_queue_rotate_interval_ms=1000,
        queue_storage_lease_rotate_interval_ms=1000,
        queue_storage_claim_rotate_interval_ms=1000,
        terminal_count_rollup_interval_ms=30_000,
    )
    jobs = [
        await client.insert(SendEmail(to="alice@example.com", subject="Welcome"), queue="email"),
        await client.insert(SendEmail(to="bob@example.com", subject="Welcome"), queue="email"),
        await client.insert(BuildReport(name="weekly"), queue="reports"),
    ]
    try:
        for job in jobs:
            for _ in range(200):  # awa's guide sleeps and reads the job back; so do we, bounded
                result = await client.get_job(job.id)
                if result.state == awa.JobState.Completed:
                    break
                await asyncio.sleep(0.05)
            print(f"job {result.id} {result.kind} state = {result.state}")
    finally:
        await client.shutdown()
    print(f"sent: {', '.join(sorted(sent))}")


asyncio.run(main())
