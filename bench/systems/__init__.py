"""One adapter per queue system. Each adapter follows its system's documented fastest durable
configuration; see docs/benchmarking.md for the per-peer notes."""

from __future__ import annotations

import importlib

NAMES = ("awa_fast", "awa_pg", "pgqueuer", "procrastinate")
MODULES = {
    "awa_fast": "bench.systems.awa_fast_sys",
    "awa_pg": "bench.systems.awa_pg_sys",
    "pgqueuer": "bench.systems.pgqueuer_sys",
    "procrastinate": "bench.systems.procrastinate_sys",
}


class NotSupported(Exception):
    """The system has no equivalent of this scenario."""


def load(name: str):
    """The adapter object of ``name``; raises ImportError (with the reason) if unavailable."""
    mod = importlib.import_module(MODULES[name])
    return mod.Adapter()


def dist_version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "not installed"
