"""A worker application with a failure consequence, run as a subprocess by the crash tests.

``AWA_FAST_APP_DSN``: the database. ``CRASH_AFTER_EFFECT=1``: the first time the effect runs for
a job, the process SIGKILLs itself after the effect and before the settlement commits.
``python -m tests.consequence_app fail_external|resolve CALLBACK_ID``: only call ``fail_external``
(or ``resolve_callback`` with a payload its ``on_fail`` matches) as a client process, no worker.
"""

import asyncio
import dataclasses
import os
import signal
import sys

import psycopg

import awa_fast as awa

DSN = os.environ.get("AWA_FAST_APP_DSN", "")
client = awa.AsyncClient(DSN)


@dataclasses.dataclass
class Reserve:
    item: str
    qty: int
    mode: str = "fail"


async def release_reservation(failure: awa.JobFailure) -> None:
    """Repeat-safe: the reservation row guards the stock update (an external system here: its
    own autocommit connection, so the write survives a crash before our commit)."""
    async with await psycopg.AsyncConnection.connect(failure.conn.info.dsn, autocommit=True) as ext:
        await ext.execute(
            "INSERT INTO public.effect_log (job_id, reason) VALUES (%s, %s)",
            (failure.id, failure.reason),
        )
        cur = await ext.execute(
            "UPDATE public.reservations SET released = true WHERE job_id = %s AND NOT released "
            "RETURNING qty",
            (failure.id,),
        )
        row = await cur.fetchone()
        if row:
            await ext.execute(
                "UPDATE public.stock SET available = available + %s WHERE item = %s",
                (row[0], failure.args.item),
            )
        runs = (
            await (
                await ext.execute(
                    "SELECT count(*) FROM public.effect_log WHERE job_id = %s", (failure.id,)
                )
            ).fetchone()
        )[0]
    if os.environ.get("CRASH_AFTER_EFFECT") and runs == 1:
        os.kill(os.getpid(), signal.SIGKILL)


@client.task(Reserve, failure_consequence=release_reservation)
async def reserve(job):
    if job.args.mode == "hang":
        print("started", job.id, flush=True)
        await asyncio.Event().wait()
    raise awa.TerminalError("payment declined")


async def main() -> None:
    if sys.argv[1:2] == ["fail_external"]:  # a client process failing a parked job, no worker
        await client.fail_external(sys.argv[2], "provider declined")
        return
    if sys.argv[1:2] == ["resolve"]:  # ... through the callback's CEL on_fail expression
        await client.resolve_callback(sys.argv[2], {"status": "declined"})
        return
    await client.start([("default", 4)], heartbeat_interval_ms=100, maintenance=False)
    print("ready", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main())
