"""Reserve stock; on failure, release the reservation -- a failure consequence, end to end.

Run: ``python examples/reserve_stock.py`` (the database URL by awa-fast's usual rule:
``$AWA_FAST_DATABASE_URL``, then ``$DATABASE_URL``, else the embedded PostgreSQL). The payment step always fails; the inventory service refuses the first two
release attempts. The job waits visibly in ``consequence_pending`` and the reconciler retries
until the release succeeds, then settles the job as failed. Stock ends where it started.
"""

import asyncio
import dataclasses

import awa_fast as awa
from awa_fast.database_url import resolve_database_url


@dataclasses.dataclass
class ReserveStock:
    order_id: str
    item: str
    qty: int


SCHEMA = """
CREATE TABLE IF NOT EXISTS demo_stock (item text PRIMARY KEY, available int NOT NULL);
CREATE TABLE IF NOT EXISTS demo_reservations (
    order_id text PRIMARY KEY, item text NOT NULL, qty int NOT NULL,
    released boolean NOT NULL DEFAULT false);
TRUNCATE demo_stock, demo_reservations;
INSERT INTO demo_stock VALUES ('widget', 10);
"""
release_attempts = 0


async def release_reservation(failure: awa.JobFailure) -> None:
    """Repeat-safe: the reservation row's ``released`` flag guards the stock update, and both
    writes go through ``failure.conn`` so they commit with the settlement or not at all."""
    global release_attempts
    release_attempts += 1
    if release_attempts <= 2:
        raise ConnectionError("inventory service unavailable")
    cur = await failure.conn.execute(
        "UPDATE demo_reservations SET released = true WHERE order_id = %s AND NOT released "
        "RETURNING item, qty",
        (failure.args.order_id,),
    )
    row = await cur.fetchone()
    if row:  # a repeat finds it released and does nothing
        await failure.conn.execute(
            "UPDATE demo_stock SET available = available + %s WHERE item = %s", (row[1], row[0])
        )


def build_client(url: str) -> awa.AsyncClient:
    client = awa.AsyncClient(url)

    @client.task(ReserveStock, failure_consequence=release_reservation)
    async def reserve_stock(job):
        pool = await client.pool()
        async with pool.connection() as conn:
            async with conn.transaction():
                await conn.execute(
                    "INSERT INTO demo_reservations (order_id, item, qty) VALUES (%s, %s, %s) "
                    "ON CONFLICT DO NOTHING",
                    (job.args.order_id, job.args.item, job.args.qty),
                )
                await conn.execute(
                    "UPDATE demo_stock SET available = available - %s WHERE item = %s",
                    (job.args.qty, job.args.item),
                )
        raise awa.TerminalError("payment declined")

    return client


async def main() -> None:
    client = build_client(resolve_database_url())
    await client.migrate()
    pool = await client.pool()
    async with pool.connection() as conn:
        await conn.execute(SCHEMA)
    job = await client.insert(ReserveStock("o-1", "widget", 3), max_attempts=1)
    await client.start([("default", 2)], reconcile_interval_ms=100, consequence_backoff_ms=200)
    seen = set()
    while True:
        current = await client.get_job(job.id)
        if current.state not in seen:
            seen.add(current.state)
            print(f"job {job.id}: {current.state}")
        if current.state == awa.JobState.Failed:
            break
        await asyncio.sleep(0.05)
    async with pool.connection() as conn:
        stock = (await (await conn.execute("SELECT available FROM demo_stock")).fetchone())[0]
        row = await (
            await conn.execute(
                "SELECT consequence_state, consequence_reason, consequence_path "
                "FROM awa_fast.jobs_all WHERE id = %s",  # a finished job is in jobs_done
                (job.id,),
            )
        ).fetchone()
    print(f"release attempts: {release_attempts}; consequence: {row}; widget stock: {stock}")
    await client.close()


if __name__ == "__main__":
    asyncio.run(main())
