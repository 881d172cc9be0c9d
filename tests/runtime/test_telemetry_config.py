"""init_telemetry's documented errors (no database): the OTLP exporter not installed, bad or
unused options, a second install after shutdown_telemetry; none installs anything."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from awa_fast import telemetry
from awa_fast.errors import ConfigError, ValidationError
from awa_fast.telemetry import MAX_EXPORT_INTERVAL_MS

ROOT = Path(__file__).resolve().parents[2]

EXPORTER = "opentelemetry.exporter.otlp.proto.grpc.metric_exporter"


def test_init_telemetry_without_the_otlp_exporter_raises_config_error(monkeypatch):
    assert telemetry._providers is None  # nothing installed in this process
    monkeypatch.setitem(sys.modules, EXPORTER, None)  # the import fails as if not installed
    with pytest.raises(ConfigError) as info:
        telemetry.init_telemetry("http://localhost:4317", "awa-fast-test")
    assert info.value.field == "endpoint"
    assert "awa-fast[otel]" in str(info.value)
    assert telemetry._providers is None  # nothing was installed


def _installs(**options) -> dict:
    return dict(
        metric_reader=InMemoryMetricReader(),
        span_processor=SimpleSpanProcessor(InMemorySpanExporter()),
        **options,
    )


@pytest.mark.parametrize(
    ("options", "field", "limit"),
    [
        # 10**30: accepted, the periodic reader's thread died of OverflowError, nothing exported
        (dict(export_interval_ms=10**30), "export_interval_ms", str(MAX_EXPORT_INTERVAL_MS)),
        (dict(export_interval_ms=MAX_EXPORT_INTERVAL_MS + 1), "export_interval_ms", "<="),
        (dict(export_interval_ms=True), "export_interval_ms", "1.."),
        (dict(export_interval_ms=1.5), "export_interval_ms", "1.."),
        (dict(export_interval_ms=0), "export_interval_ms", "1.."),
        (dict(traces="no"), "traces", "bool"),
        (dict(endpoint="\x00"), "endpoint", "control characters"),
        (dict(endpoint="http://local host:4317"), "endpoint", "spaces"),
    ],
)
def test_init_telemetry_rejects_bad_values_and_installs_nothing(options, field, limit):
    kwargs = dict(endpoint="http://localhost:4317", service_name="svc")
    kwargs.update(options)
    if "export_interval_ms" in options:  # the OTLP reader's option: no metric_reader with it
        kwargs.update(span_processor=SimpleSpanProcessor(InMemorySpanExporter()))
    else:
        kwargs.update(_installs())
    with pytest.raises(ValidationError) as info:
        telemetry.init_telemetry(**kwargs)
    assert info.value.field == field
    assert limit in str(info.value) + str(info.value.limit)
    assert telemetry._providers is None


def test_the_longest_export_interval_fits_the_periodic_readers_wait():
    assert MAX_EXPORT_INTERVAL_MS / 1000 <= threading.TIMEOUT_MAX


@pytest.mark.parametrize(
    ("options", "field"),
    [
        # each was accepted and then unused (or failed later, after installing)
        (dict(export_interval_ms=1000), "export_interval_ms"),  # with a metric_reader
        (dict(traces=False), "span_processor"),
        (dict(metric_reader="reader"), "metric_reader"),
        (dict(span_processor=object()), "span_processor"),
    ],
)
def test_init_telemetry_rejects_options_it_would_ignore(options, field):
    kwargs = _installs()
    kwargs.update(options)
    with pytest.raises(ValidationError) as info:
        telemetry.init_telemetry("http://localhost:4317", "svc", **kwargs)
    assert info.value.field == field
    assert telemetry._providers is None


def _run(body: str) -> str:
    """SETUP then ``body`` in a fresh interpreter (OpenTelemetry's providers are per process)."""
    r = subprocess.run(
        [sys.executable, "-c", SETUP + textwrap.dedent(body)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout


SETUP = """
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from awa_fast import telemetry
from awa_fast.errors import ConfigError

def install(exporter, **options):
    return telemetry.init_telemetry(
        "http://localhost:4317", "svc", metric_reader=InMemoryMetricReader(),
        span_processor=SimpleSpanProcessor(exporter), **options)
"""


def test_init_telemetry_after_shutdown_raises_config_error():
    """It returned True, and the handler's spans went to the shut-down provider."""
    out = _run(
        """
        first = InMemorySpanExporter()
        assert install(first) is True
        with telemetry.handler_span("k", "q", 1, 1, None):
            pass
        assert len(first.get_finished_spans()) == 1
        telemetry.shutdown_telemetry()
        try:
            install(InMemorySpanExporter())
        except ConfigError as exc:
            assert exc.field == "init_telemetry" and exc.limit == "once per process", exc
            assert "after shutdown_telemetry" in str(exc), exc
            assert telemetry._providers is None and not telemetry.metrics_on()
            print("rejected")
        """
    )
    assert out.split() == ["rejected"]


def test_traces_with_an_application_tracer_provider_raise_config_error():
    """OpenTelemetry keeps the first tracer provider: ours would silently not be installed."""
    out = _run(
        """
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        trace.set_tracer_provider(TracerProvider())
        try:
            install(InMemorySpanExporter())
        except ConfigError as exc:
            assert exc.field == "traces" and "traces=False" in str(exc), exc
            assert telemetry._providers is None
            print("rejected")
        print(telemetry.init_telemetry(
            "http://localhost:4317", "svc", traces=False, metric_reader=InMemoryMetricReader()))
        """
    )
    assert out.split() == ["rejected", "True"]


def test_traces_left_unset_go_to_an_application_tracer_provider():
    """awa-pg's call, `init_telemetry(endpoint, service_name)`, in an application that set up
    OpenTelemetry itself: installed, and awa-fast's spans go to the application's provider."""
    out = _run(
        """
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        theirs = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(theirs))
        trace.set_tracer_provider(provider)
        print(telemetry.init_telemetry(
            "http://localhost:4317", "svc", metric_reader=InMemoryMetricReader()))
        with telemetry.handler_span("k", "q", 1, 1, None):
            pass
        print(len(theirs.get_finished_spans()))
        """
    )
    assert out.split() == ["True", "1"]
