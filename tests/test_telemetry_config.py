"""init_telemetry's documented error when the OTLP exporter is not installed (no database)."""

from __future__ import annotations

import sys

import pytest

from awa_fast import telemetry
from awa_fast.errors import ConfigError

EXPORTER = "opentelemetry.exporter.otlp.proto.grpc.metric_exporter"


def test_init_telemetry_without_the_otlp_exporter_raises_config_error(monkeypatch):
    assert telemetry._providers is None  # nothing installed in this process
    monkeypatch.setitem(sys.modules, EXPORTER, None)  # the import fails as if not installed
    with pytest.raises(ConfigError) as info:
        telemetry.init_telemetry("http://localhost:4317", "awa-fast-test")
    assert info.value.field == "endpoint"
    assert "awa-fast[otel]" in str(info.value)
    assert telemetry._providers is None  # nothing was installed
