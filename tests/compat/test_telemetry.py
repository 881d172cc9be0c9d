"""awa-pg's init_telemetry / shutdown_telemetry and W3C trace propagation (awa ADR-039) on a
real PostgreSQL, observed through the OpenTelemetry SDK's in-memory exporter and reader: the
producer's span context is stored as ``awa:traceparent`` at insert, the handler runs in a
``job.execute`` span whose parent is that context (async and def handlers), a retry starts a
new trace linked to it, outcomes are counted; without OpenTelemetry nothing of it is imported."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import awa_fast as awa
from tests.support import FAST, wait_state

pytestmark = pytest.mark.usefixtures("clean")


@dataclasses.dataclass
class Traced:
    fail_first: bool = False


@dataclasses.dataclass
class TracedSync:
    n: int = 0


@pytest.fixture(scope="module")
def otel():
    exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
    assert (
        awa.init_telemetry(
            "http://localhost:4317",
            "awa-fast-test",
            metric_reader=reader,
            span_processor=SimpleSpanProcessor(exporter),
        )
        is True
    )
    yield exporter, reader
    awa.shutdown_telemetry()


def test_init_telemetry_once_and_its_arguments(otel):
    assert awa.init_telemetry("http://localhost:4317", "again") is False  # awa: already installed
    with pytest.raises(awa.ValidationError) as info:
        awa.init_telemetry("", "svc")
    assert info.value.field == "endpoint"
    with pytest.raises(awa.ValidationError) as info:
        awa.init_telemetry("http://x:4317", "svc", export_interval_ms=0)
    assert info.value.field == "export_interval_ms"


def _spans(exporter, name):
    return [s for s in exporter.get_finished_spans() if s.name == name]


async def test_handler_runs_in_the_producers_trace(dsn, client, otel):
    exporter, reader = otel
    exporter.clear()
    seen = {}

    @client.task(Traced)
    async def traced(job):
        with trace.get_tracer("app").start_as_current_span("handler-work"):
            seen[job.id] = trace.get_current_span().get_span_context()

    @client.task(TracedSync)
    def traced_sync(job):  # a def handler: runs in a thread, in the span's context
        seen[job.id] = trace.get_current_span().get_span_context()

    tracer = trace.get_tracer("producer")
    with tracer.start_as_current_span("produce") as produce:
        job = await client.insert(Traced())
        sync_job = await client.insert(TracedSync(1))
    untraced = await client.insert(Traced())  # no span current: nothing stored
    own = await client.insert(
        Traced(), metadata={"awa:traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}
    )
    pc = produce.get_span_context()
    assert job.metadata["awa:traceparent"] == (
        f"00-{pc.trace_id:032x}-{pc.span_id:016x}-{pc.trace_flags:02x}"
    )
    assert "awa:traceparent" not in untraced.metadata
    assert own.metadata["awa:traceparent"].startswith("00-" + "1" * 32)  # the caller's wins

    await client.start([("default", 4)], **FAST)
    for j in (job, sync_job, untraced, own):
        await wait_state(client, j.id, "completed")
    await client.shutdown()

    execs = {s.attributes["job.id"]: s for s in _spans(exporter, "job.execute traced")}
    execs.update({s.attributes["job.id"]: s for s in _spans(exporter, "job.execute traced_sync")})
    span = execs[job.id]
    assert span.context.trace_id == pc.trace_id and span.parent.span_id == pc.span_id
    assert span.kind == trace.SpanKind.CONSUMER
    assert (
        span.attributes["messaging.system"] == "awa" and span.attributes["job.queue"] == "default"
    )
    assert span.attributes["awa.job.outcome"] == "completed"
    # the handler's own span nests under job.execute
    work = [s for s in _spans(exporter, "handler-work") if s.context.trace_id == pc.trace_id]
    assert len(work) == 1 and work[0].parent.span_id == span.context.span_id
    assert seen[sync_job.id].trace_id == pc.trace_id
    assert seen[sync_job.id].span_id == execs[sync_job.id].context.span_id
    assert execs[untraced.id].parent is None and execs[untraced.id].context.trace_id != pc.trace_id
    assert execs[own.id].context.trace_id == int("1" * 32, 16)

    # outcomes counted on awa's instruments
    data = reader.get_metrics_data()
    names = {
        m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
    }
    completed = sum(p.value for p in names["awa.job.completed"].data.data_points)
    assert completed >= 4 and "awa.job.duration" in names


async def test_a_retry_starts_a_new_trace_linked_to_the_producer(dsn, client, otel):
    exporter, _ = otel
    exporter.clear()

    @client.task(Traced)
    async def traced(job):
        if job.args.fail_first and job.attempt == 1:
            raise RuntimeError("first attempt fails")

    with trace.get_tracer("producer").start_as_current_span("produce") as produce:
        job = await client.insert(Traced(fail_first=True), max_attempts=3)
    pc = produce.get_span_context()
    await client.start([("default", 1)], **FAST)
    await wait_state(client, job.id, "completed")  # after awa's backoff (2-2.5 s)
    await client.shutdown()
    first, second = sorted(
        (s for s in _spans(exporter, "job.execute traced") if s.attributes["job.id"] == job.id),
        key=lambda s: s.attributes["job.attempt"],
    )
    assert first.context.trace_id == pc.trace_id and first.status.status_code.name == "ERROR"
    assert second.context.trace_id != pc.trace_id and second.parent is None
    assert [link.context.span_id for link in second.links] == [pc.span_id]


def test_without_opentelemetry_nothing_is_imported():
    code = (
        "import sys, awa_fast\n"
        "from awa_fast.requests import prepare\n"
        "p = prepare({'a': 1}, kind='k')\n"
        "assert 'awa:traceparent' not in p.metadata\n"
        "assert not [m for m in sys.modules if m.startswith('opentelemetry')], "
        "sorted(m for m in sys.modules if m.startswith('opentelemetry'))\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
