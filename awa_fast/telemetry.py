"""OpenTelemetry: awa-pg's ``init_telemetry`` / ``shutdown_telemetry`` (OTLP metrics and traces
through the OpenTelemetry SDK, the ``otel`` extra) and W3C trace-context propagation from
``insert`` to the handler (awa's ADR-039).

Propagation works with any configured OpenTelemetry SDK, ours or the application's:
- at insert, the producer's current span context is stored in the job's metadata under awa's
  reserved key ``awa:traceparent`` (a caller-supplied value wins; ``AWA_TRACE_CAPTURE=off``
  disables capture, as in awa);
- the handler runs inside a ``job.execute <kind>`` span (consumer kind, awa's attributes) whose
  parent is that context on a first attempt; a retry starts a new trace linked to it (awa: a
  retry hours later should not stretch the producer's trace). The span is the handler's current
  context, so the handler's own spans nest under it.

Cost when OpenTelemetry is not in use: one ``sys.modules`` lookup per insert and per attempt
(the SDK is never imported by awa-fast unless :func:`init_telemetry` is called), and one
module-global check per attempt for the metrics.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import types
from typing import TYPE_CHECKING, Any

from awa_fast.errors import ConfigError, ValidationError

if TYPE_CHECKING:
    from contextvars import Token

    from opentelemetry.context import Context

TRACE_KEY = "awa:traceparent"
_CAPTURE_ENV = "AWA_TRACE_CAPTURE"
_OTEL_TRACE = "opentelemetry.trace"

# The longest export interval: the bound of awa-fast's other ``_ms`` settings (about 24.8 days);
# far longer overflows the periodic reader's wait, whose thread then dies and exports nothing.
MAX_EXPORT_INTERVAL_MS = 2**31 - 1

_lock = threading.Lock()
_providers: tuple[Any, Any] | None = None  # (MeterProvider, TracerProvider or None)
_installed_once = False  # OpenTelemetry's global providers can be set once per process
_instruments: dict | None = None  # set by init_telemetry; None = no metrics recorded


def tracing_imported() -> bool:
    """Whether OpenTelemetry's trace API is imported in this process: without it no attempt has
    a span, so the executor skips decoding each job's metadata for one."""
    return _OTEL_TRACE in sys.modules


def current_traceparent() -> str | None:
    """The current OpenTelemetry span context as a W3C ``traceparent``, or ``None`` (OpenTelemetry
    not imported, no SDK configured, or no span current)."""
    trace = sys.modules.get(_OTEL_TRACE)
    if trace is None:
        return None
    sc = trace.get_current_span().get_span_context()
    if not sc.is_valid:
        return None
    return f"00-{sc.trace_id:032x}-{sc.span_id:016x}-{sc.trace_flags:02x}"


def inject(metadata: dict | None) -> dict | None:
    """``metadata`` with the current ``traceparent`` under ``awa:traceparent`` (a copy; the
    input is never changed), or ``metadata`` itself when there is nothing to add."""
    if sys.modules.get(_OTEL_TRACE) is None or (
        metadata is not None and (not isinstance(metadata, dict) or TRACE_KEY in metadata)
    ):
        return metadata  # nothing to do, or the caller's value (or bad metadata, rejected later)
    traceparent = current_traceparent()
    if traceparent is None or os.environ.get(_CAPTURE_ENV, "").strip().lower() in (
        "off",
        "false",
        "0",
    ):
        return metadata
    out = dict(metadata) if metadata else {}
    out[TRACE_KEY] = traceparent
    return out


class HandlerSpan:
    """The ``job.execute`` span of one attempt, current while the handler runs (``with``)."""

    __slots__ = ("_span", "_token", "_context", "_started")

    def __init__(self, span: Any, context: Any):
        self._span, self._context = span, context
        self._token: Token[Context] | None = None
        self._started = time.perf_counter()

    def __enter__(self) -> HandlerSpan:
        from opentelemetry import context as otel_context

        self._token = otel_context.attach(self._context)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        from opentelemetry import context as otel_context
        from opentelemetry.trace import Status, StatusCode

        if self._token is not None:
            otel_context.detach(self._token)
        if self._span is not None:
            if exc is not None and not isinstance(exc, GeneratorExit):
                self._span.record_exception(exc)
                self._span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            self._span.end()

    def outcome(self, kind: str, error: dict | None) -> None:
        """Record the attempt's outcome (``completed``, ``retryable``, ...) on the span; one
        with an error entry (the handler raised, or failed terminally) marks it an error."""
        if self._span is not None:
            self._span.set_attribute("awa.job.outcome", kind)
            if error:
                from opentelemetry.trace import Status, StatusCode

                self._span.set_status(Status(StatusCode.ERROR, str(error.get("error", kind))))


def handler_span(
    kind: str, queue: str, job_id: int, attempt: int, metadata: dict | None
) -> HandlerSpan | None:
    """The span to run an attempt in, or ``None`` when OpenTelemetry is not in use (no SDK
    tracer provider and no producer context to continue)."""
    trace = sys.modules.get(_OTEL_TRACE)
    if trace is None:
        return None
    traceparent = metadata.get(TRACE_KEY) if metadata else None
    if not isinstance(traceparent, str):
        traceparent = None
    provider = trace.get_tracer_provider()
    recording = not isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider))
    if not recording and traceparent is None:
        return None
    from opentelemetry import context as otel_context
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    remote = (
        TraceContextTextMapPropagator().extract({"traceparent": traceparent})
        if traceparent
        else None
    )
    if not recording:  # continue the producer's context for the handler's own instrumentation
        return HandlerSpan(None, remote)
    links = []
    parent = remote
    if remote is not None and attempt > 1:
        links = [trace.Link(trace.get_current_span(remote).get_span_context())]
        parent = otel_context.Context()  # a new trace, linked to the producer's
    elif remote is None:
        parent = otel_context.Context()
    span = provider.get_tracer("awa_fast").start_span(
        f"job.execute {kind}",
        context=parent,
        kind=trace.SpanKind.CONSUMER,
        links=links,
        attributes={
            "job.id": job_id,
            "job.kind": kind,
            "job.queue": queue,
            "job.attempt": attempt,
            "messaging.system": "awa",
            "messaging.destination.name": queue,
            "messaging.operation.type": "process",
            "messaging.message.id": str(job_id),
        },
    )
    return HandlerSpan(span, trace.set_span_in_context(span, parent))


def metrics_on() -> bool:
    """Whether :func:`init_telemetry` installed metrics (one global read)."""
    return _instruments is not None


def record_attempt(kind: str, queue: str, outcome: str, seconds: float) -> None:
    """Count one attempt's outcome and its duration (seconds) once :func:`init_telemetry` ran:
    awa's ``awa.job.completed`` / ``failed`` / ``retried`` / ``cancelled`` counters and the
    ``awa.job.duration`` histogram, attributes ``awa.job.kind`` and ``awa.job.queue``."""
    instruments = _instruments
    if instruments is None:  # shut down meanwhile
        return
    attrs = {"awa.job.kind": kind, "awa.job.queue": queue}
    counter = instruments.get(outcome)
    if counter is not None:
        counter.add(1, attrs)
    instruments["duration"].record(seconds, attrs)


def _instruments_of(meter) -> dict:
    return {
        "completed": meter.create_counter("awa.job.completed", description="Jobs completed"),
        "failed": meter.create_counter("awa.job.failed", description="Jobs failed"),
        "retryable": meter.create_counter("awa.job.retried", description="Jobs retried"),
        "cancelled": meter.create_counter("awa.job.cancelled", description="Jobs cancelled"),
        "waiting_external": meter.create_counter(
            "awa.job.waiting_external", description="Jobs parked for a callback"
        ),
        "duration": meter.create_histogram(
            "awa.job.duration", unit="s", description="Handler duration"
        ),
    }


def init_telemetry(
    endpoint: str,
    service_name: str,
    export_interval_ms: int | None = None,
    traces: bool | None = None,
    *,
    metric_reader: Any = None,
    span_processor: Any = None,
) -> bool:
    """Install OpenTelemetry metrics (exported every ``export_interval_ms`` milliseconds, default
    5000) and, with ``traces``, spans, both over OTLP/gRPC to ``endpoint`` (e.g.
    ``http://localhost:4317``), under resource ``service.name = service_name``. Returns
    ``False`` (and changes nothing) when already installed, as awa does.

    Once per process: OpenTelemetry lets the global meter and tracer providers be set only once,
    so after :func:`shutdown_telemetry` a second install would export nothing (spans would go to
    the shut-down provider); it raises ``ConfigError`` instead. ``traces``: ``True`` installs a
    tracer provider exporting to ``endpoint``, ``False`` none; unset (``None``, the default),
    the same as ``True`` unless the application installed its own tracer provider first, which
    OpenTelemetry keeps: awa-fast's spans then go to it. ``traces=True`` (or a
    ``span_processor``) over the application's provider is a ``ConfigError``: ours could not be
    installed.

    ``metric_reader`` (an SDK ``MetricReader``) / ``span_processor`` (an SDK ``SpanProcessor``,
    only with ``traces``) replace the OTLP exporters (awa-fast extension, for tests or another
    transport); ``export_interval_ms`` configures the OTLP reader, so it cannot be combined
    with ``metric_reader``, which has its own.

    Raises:
        ConfigError: the OpenTelemetry SDK / OTLP exporter is not installed (``awa-fast[otel]``);
            called again after :func:`shutdown_telemetry`; a tracer provider is already
            installed and ``traces`` is True.
        ValidationError: ``endpoint`` empty or with spaces / control characters, empty
            ``service_name``, ``export_interval_ms`` not an int in 1..``MAX_EXPORT_INTERVAL_MS``
            or given with ``metric_reader``, ``traces`` not a bool, ``metric_reader`` /
            ``span_processor`` of the wrong type, or ``span_processor`` with ``traces=False``.
    """
    global _providers, _instruments, _installed_once
    _check_arguments(
        endpoint, service_name, export_interval_ms, traces, metric_reader, span_processor
    )
    with _lock:
        if _providers is not None:
            return False
        sdk = _sdk(need_otlp=metric_reader is None or bool(traces and span_processor is None))
        for field, value, kind in (
            ("metric_reader", metric_reader, sdk.MetricReader),
            ("span_processor", span_processor, sdk.SpanProcessor),
        ):
            if value is not None and not isinstance(value, kind):
                raise ValidationError(
                    f"{field} must be an OpenTelemetry SDK {kind.__name__}, got {value!r}",
                    field=field,
                )
        if _installed_once:
            raise ConfigError(
                "init_telemetry after shutdown_telemetry: OpenTelemetry sets its global "
                "providers once per process, so a second install would export nothing; "
                "install once and shut down at exit",
                field="init_telemetry",
                limit="once per process",
            )
        theirs = not isinstance(sdk.trace.get_tracer_provider(), sdk.trace.ProxyTracerProvider)
        if traces is None:  # unset: the application's provider, if it has one, gets our spans
            traces = span_processor is not None or not theirs
        if traces and theirs:
            raise ConfigError(
                "an OpenTelemetry tracer provider is already installed in this process and "
                "OpenTelemetry keeps it: leave traces unset or pass traces=False (awa-fast's "
                "spans then go to it)",
                field="traces",
                limit="traces=False when a tracer provider is installed",
            )
        _providers = _install(
            sdk, endpoint, service_name, export_interval_ms, traces, metric_reader, span_processor
        )
        _instruments = _instruments_of(_providers[0].get_meter("awa_fast"))
        _installed_once = True
        return True


def _check_arguments(
    endpoint: Any,
    service_name: Any,
    export_interval_ms: Any,
    traces: Any,
    metric_reader: Any,
    span_processor: Any,
) -> None:
    """init_telemetry's argument rules, checked before anything is imported or installed."""
    if (
        not isinstance(endpoint, str)
        or not endpoint
        or not endpoint.isprintable()
        or any(c.isspace() for c in endpoint)
    ):
        raise ValidationError(
            f"endpoint must be a non-empty URL without spaces or control characters, got "
            f"{endpoint!r}",
            field="endpoint",
        )
    if not isinstance(service_name, str) or not service_name:
        raise ValidationError("service_name must be a non-empty string", field="service_name")
    if export_interval_ms is not None:
        if (
            isinstance(export_interval_ms, bool)
            or not isinstance(export_interval_ms, int)
            or not 1 <= export_interval_ms <= MAX_EXPORT_INTERVAL_MS
        ):
            raise ValidationError(
                f"export_interval_ms must be an int in 1..{MAX_EXPORT_INTERVAL_MS} "
                f"(milliseconds, about 24.8 days at most), got {export_interval_ms!r}",
                field="export_interval_ms",
                limit=f">= 1 and <= {MAX_EXPORT_INTERVAL_MS}",
            )
        if metric_reader is not None:
            raise ValidationError(
                "export_interval_ms sets the OTLP reader's interval; a metric_reader exports "
                "on its own schedule: drop one of them",
                field="export_interval_ms",
                limit="not with metric_reader",
            )
    if traces is not None and not isinstance(traces, bool):
        raise ValidationError(f"traces must be a bool, got {traces!r}", field="traces")
    if span_processor is not None and traces is False:
        raise ValidationError(
            "span_processor exports spans, but traces=False installs none: drop one of them",
            field="span_processor",
            limit="only with traces=True",
        )


def _sdk(*, need_otlp: bool) -> types.SimpleNamespace:
    """The OpenTelemetry SDK's parts init_telemetry uses (and the OTLP exporters when
    ``need_otlp``), imported on first use: the ``otel`` extra is optional.

    Raises:
        ConfigError: the SDK or the exporter is not installed.
    """
    try:
        from opentelemetry import metrics, trace
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        sdk = types.SimpleNamespace(
            metrics=metrics,
            trace=trace,
            MeterProvider=MeterProvider,
            MetricReader=MetricReader,
            PeriodicExportingMetricReader=PeriodicExportingMetricReader,
            Resource=Resource,
            SpanProcessor=SpanProcessor,
            TracerProvider=TracerProvider,
            BatchSpanProcessor=BatchSpanProcessor,
        )
        if need_otlp:
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
                OTLPMetricExporter,
            )
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

            sdk.OTLPMetricExporter = OTLPMetricExporter
            sdk.OTLPSpanExporter = OTLPSpanExporter
    except ImportError as exc:
        raise ConfigError(
            f"init_telemetry needs the OpenTelemetry SDK and OTLP exporter: "
            f"pip install 'awa-fast[otel]' ({exc})",
            field="endpoint",
            limit="the awa-fast[otel] extra installed",
        ) from exc
    return sdk


def _install(
    sdk: types.SimpleNamespace,
    endpoint: str,
    service_name: str,
    export_interval_ms: int | None,
    traces: bool,
    metric_reader: Any,
    span_processor: Any,
) -> tuple[Any, Any]:
    """Build and set the global meter provider (and tracer provider, with ``traces``):
    ``(meter_provider, tracer_provider or None)``."""
    resource = sdk.Resource.create({"service.name": service_name})
    if metric_reader is None:
        metric_reader = sdk.PeriodicExportingMetricReader(
            sdk.OTLPMetricExporter(endpoint=endpoint),
            export_interval_millis=5000 if export_interval_ms is None else export_interval_ms,
        )
    meter_provider = sdk.MeterProvider(resource=resource, metric_readers=[metric_reader])
    tracer_provider = None
    if traces:
        tracer_provider = sdk.TracerProvider(resource=resource)
        tracer_provider.add_span_processor(
            span_processor or sdk.BatchSpanProcessor(sdk.OTLPSpanExporter(endpoint=endpoint))
        )
        sdk.trace.set_tracer_provider(tracer_provider)
    sdk.metrics.set_meter_provider(meter_provider)
    return meter_provider, tracer_provider


def shutdown_telemetry() -> None:
    """Flush and stop what :func:`init_telemetry` installed (no-op if nothing was). Metrics
    stop being recorded; for good: OpenTelemetry lets the global providers be set only once
    per process, so a later :func:`init_telemetry` raises ``ConfigError``."""
    global _providers, _instruments
    with _lock:
        if _providers is None:
            return
        meter_provider, tracer_provider = _providers
        _providers = _instruments = None
    if tracer_provider is not None:
        tracer_provider.shutdown()
    meter_provider.shutdown()
