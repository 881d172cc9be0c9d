"""A kind registered with ``queue="images"`` and inserted without ``queue=`` goes to
``default``, as awa-pg's (its ``insert(queue="default")``; the decorator's queue only checks what
``start()`` serves): every way of doing so warns ``QueueMismatchWarning`` at the call, naming the
kind and its registered queue. ``insert`` and ``insert_many`` did; an insert inside
``transaction()`` and a ``periodic()`` schedule without ``queue=`` did not."""

from __future__ import annotations

import dataclasses
import warnings

import pytest

import awa_fast as awa
from awa_fast.errors import QueueMismatchWarning

pytestmark = pytest.mark.usefixtures("clean")


@dataclasses.dataclass
class Thumb:
    n: int


def _register(client) -> None:
    @client.task(Thumb, queue="images", failure_consequence=awa.NO_FAILURE_CONSEQUENCE)
    async def thumb(job):
        pass


async def test_an_insert_in_a_transaction_without_queue_warns_naming_the_registered_queue(
    client,
):
    _register(client)
    tx = await client.transaction()
    async with tx:
        with pytest.warns(QueueMismatchWarning) as caught:
            job = await tx.insert(Thumb(1))
    assert job.queue == "default"  # awa-pg semantics: the insert's queue decides
    (w,) = caught
    assert "'thumb'" in str(w.message) and "queue 'images'" in str(w.message)
    assert w.filename == __file__  # at the caller's line
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tx = await client.transaction()
        async with tx:
            assert (await tx.insert(Thumb(2), queue="images")).queue == "images"
            assert (await tx.insert_many([Thumb(3)], queue="images"))[0].queue == "images"


async def test_insert_many_in_a_transaction_without_queue_warns(client):
    _register(client)
    tx = await client.transaction()
    async with tx:
        with pytest.warns(
            QueueMismatchWarning, match="'thumb' is registered for queue 'images'"
        ) as caught:
            jobs = await tx.insert_many([Thumb(1), Thumb(2)])
    assert [w.filename for w in caught] == [__file__]
    assert [j.queue for j in jobs] == ["default", "default"]


async def test_a_schedule_without_queue_for_a_kind_registered_elsewhere_warns_at_start(client):
    _register(client)
    client.periodic("nightly_thumbs", "0 3 * * *", Thumb, Thumb(1))
    client.periodic("hourly_thumbs", "0 * * * *", Thumb, Thumb(1), queue="images")
    with pytest.warns(QueueMismatchWarning) as caught:
        await client.start([("images", 1)])
    await client.shutdown()
    mine = [str(w.message) for w in caught if "periodic job" in str(w.message)]
    assert len(mine) == 1, mine
    assert "'nightly_thumbs' of kind 'thumb'" in mine[0] and "queue='images'" in mine[0]
    assert {w.filename for w in caught if "periodic job" in str(w.message)} == {__file__}
    assert client.periodic_jobs["nightly_thumbs"].queue == "default"  # awa-pg's default


def test_check_reports_the_schedules_queue_mismatch_as_a_line_of_its_report(tmp_path, dsn):
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    (tmp_path / "sched_app.py").write_text(
        "import dataclasses\nimport awa_fast as awa\n"
        f"client = awa.AsyncClient({dsn!r})\n"
        "@dataclasses.dataclass\nclass Thumb:\n    n: int\n"
        "@client.task(Thumb, queue='images', failure_consequence=awa.NO_FAILURE_CONSEQUENCE)\n"
        "async def thumb(job):\n    pass\n"
        "client.periodic('nightly_thumbs', '0 3 * * *', Thumb, Thumb(1))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}

    def check(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "awa_fast", "check", "sched_app:client", *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )

    r = check()
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert r.stdout.startswith("warning: periodic job 'nightly_thumbs' of kind 'thumb' "), r.stdout
    (warning,) = json.loads(check("--json").stdout)["warnings"]
    assert "pass queue='images' to periodic()" in warning
