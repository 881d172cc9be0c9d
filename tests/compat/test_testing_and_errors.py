"""awa's exception tree (0.7 storage errors included) and awa.testing: JobRow, and WorkResult with
the job's final row and awa's error text."""

from __future__ import annotations

import dataclasses

import pytest

import awa_fast as awa
from awa_fast.testing import AwaTestClient, JobRow, NoJob

pytestmark = pytest.mark.usefixtures("clean")


def test_awa_07_exceptions_are_in_the_tree():
    for name in (
        "StorageNotFinalized",
        "LiveRuntimesRequireExclusiveWindow",
        "RuntimeVersionFloorNotMet",
        "UniqueConflict",
        "SchemaNotMigrated",
        "UnknownJobKind",
        "SerializationError",
        "ValidationError",
        "TerminalError",
        "DatabaseError",
        "CallbackNotFound",
    ):
        assert issubclass(getattr(awa, name), awa.AwaError), name
    assert issubclass(awa.Unsupported, awa.ValidationError)


@dataclasses.dataclass
class Probe:
    mode: str


async def _handler(job):
    mode = job.args.mode
    if mode == "boom":
        raise ValueError("it broke")
    if mode == "terminal":
        raise awa.TerminalError("fatal input")
    if mode == "cancel":
        return awa.Cancel("not needed")
    if mode == "snooze":
        return awa.Snooze(30)
    return None


@pytest.mark.parametrize(
    "mode, outcome, state, error",
    [
        ("ok", "completed", "completed", None),
        ("boom", "retryable", "retryable", "it broke"),
        ("terminal", "failed", "failed", "fatal input"),
        ("cancel", "cancelled", "cancelled", "not needed"),
        ("snooze", "snoozed", "scheduled", None),
    ],
)
async def test_work_one_reports_the_final_row_and_awas_error_text(
    client, mode, outcome, state, error
):
    client.failure_consequence(Probe, awa.NO_FAILURE_CONSEQUENCE)
    harness = AwaTestClient(client)
    inserted = await client.insert(Probe(mode), max_attempts=3, tags=["t"])
    res = await harness.work_one(Probe, _handler)
    assert res.outcome == outcome and res.error == error
    assert isinstance(res.job, JobRow)
    assert res.job == JobRow(
        id=inserted.id,
        kind="probe",
        queue="default",
        args={"mode": mode},
        attempt=0 if mode == "snooze" else 1,
        max_attempts=3,
        priority=2,
        tags=["t"],
        state=state,
    )


async def test_work_one_without_a_job(client):
    res = await AwaTestClient(client).work_one(Probe, _handler)
    assert res.is_no_job() and res.job is NoJob and not res.job
