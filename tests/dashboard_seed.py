"""Seed a database with what every dashboard page shows, through the real client and runtime.

:func:`seed` registers handlers, inserts jobs, runs a worker until each job reached the state it
is meant to show, then shuts the worker down. It returns the ids:

* ``order`` completed and staged ``ship`` (a follow-up: lineage both ways);
* ``boom`` failed terminally (no consequence declared: retryable from the dashboard);
* ``later`` scheduled an hour ahead (cancellable);
* ``dead`` exhausted on the DLQ-enabled queue ``billing`` (in the DLQ);
* ``charge`` failed with a consequence whose effect raised (``consequence_pending``, owed);
* ``refund`` failed with a consequence that applied;
* the cron schedule ``nightly-report`` is stored by ``start()``.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import awa_fast as awa
from tests.support import FAST, scalar, until, wait_state

NONE = awa.NO_FAILURE_CONSEQUENCE


@dataclasses.dataclass
class PlaceOrder:
    order: int


@dataclasses.dataclass
class ShipOrder:
    order: int


@dataclasses.dataclass
class SendInvoice:
    order: int


@dataclasses.dataclass
class ChargeCard:
    order: int


@dataclasses.dataclass
class RefundCard:
    order: int


@dataclasses.dataclass
class NightlyReport:
    pass


async def _release_fails(failure: awa.JobFailure) -> None:
    raise RuntimeError("stock service unreachable")


async def _release_ok(failure: awa.JobFailure) -> None:
    return None


def register(client: awa.AsyncClient) -> None:
    @client.task(PlaceOrder, failure_consequence=NONE)
    async def place_order(job):
        job.enqueue_on_completion(ShipOrder(job.args.order), queue="shipping")

    @client.task(ShipOrder, queue="shipping", failure_consequence=NONE)
    async def ship_order(job):
        return None

    @client.task(SendInvoice, failure_consequence=NONE)
    async def send_invoice(job):
        job.set_progress(40, "rendering invoice")  # kept on failure (completion clears it)
        raise awa.TerminalError(f"invoice template missing for order {job.args.order}")

    @client.task(ChargeCard, queue="billing", failure_consequence=_release_fails)
    async def charge_card(job):
        raise awa.TerminalError("card declined")

    @client.task(RefundCard, failure_consequence=_release_ok)
    async def refund_card(job):
        raise awa.TerminalError("refund window closed")

    @client.task(NightlyReport, failure_consequence=NONE)
    async def nightly_report(job):
        return None

    client.periodic("nightly-report", "0 3 * * *", NightlyReport, NightlyReport())


async def seed(dsn: str) -> dict[str, int]:
    """Seed ``dsn`` (see the module docstring); returns the job ids by role."""
    client = awa.AsyncClient(dsn)
    register(client)
    try:
        order = (await client.insert(PlaceOrder(1001))).id
        boom = (await client.insert(SendInvoice(1001))).id
        later = (
            await client.insert(PlaceOrder(1002), run_at=datetime.now(UTC) + timedelta(hours=1))
        ).id
        dead = (await client.insert(SendInvoice(7), queue="billing", max_attempts=1)).id
        charge = (await client.insert(ChargeCard(1001), queue="billing")).id
        refund = (await client.insert(RefundCard(1001))).id
        await client.start(
            [("default", 4), ("shipping", 2), {"name": "billing", "max_workers": 2, "dlq": True}],
            **FAST,
        )
        await wait_state(client, order, "completed")
        await wait_state(client, boom, "failed")
        await wait_state(client, charge, "consequence_pending")
        await wait_state(client, refund, "failed")
        await until(lambda: client.get_dlq_job(dead), client, what=f"job {dead} in the DLQ")
        ship = await until(
            lambda: scalar(
                dsn,
                "SELECT max(id) FROM awa_fast.jobs_all WHERE metadata->>'awa:triggered_by' = %s",
                (str(order),),
            ),
            client,
            what=f"the follow-up of job {order}",
        )
        await wait_state(client, ship, "completed")
    finally:
        await client.close()
    return {
        "order": order,
        "ship": ship,
        "boom": boom,
        "later": later,
        "dead": dead,
        "charge": charge,
        "refund": refund,
    }
