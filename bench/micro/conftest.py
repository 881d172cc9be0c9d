"""Prints the compiled/reference speed-up per benchmark group after a ``--benchmark-only`` run."""

from __future__ import annotations


def pytest_terminal_summary(terminalreporter, config):
    session = getattr(config, "_benchmarksession", None)
    medians: dict[str, dict[str, float]] = {}
    for fixture in getattr(session, "benchmarks", None) or []:
        meta = getattr(fixture, "stats", None)
        impl = (getattr(fixture, "extra_info", None) or {}).get("impl")
        if meta and impl:
            medians.setdefault(fixture.group, {})[impl] = getattr(meta, "stats", meta).median
    rows = {g: m for g, m in medians.items() if {"compiled", "reference"} <= set(m)}
    if not rows:
        return
    w = max(len(g) for g in rows)
    terminalreporter.write_sep("-", "speed-up of the compiled hot path (medians)")
    terminalreporter.write_line(
        f"{'operation':<{w}}  {'compiled':>12}  {'reference':>12}  {'speed-up':>8}"
    )
    for group in sorted(rows):
        c, r = rows[group]["compiled"], rows[group]["reference"]
        terminalreporter.write_line(f"{group:<{w}}  {_fmt(c):>12}  {_fmt(r):>12}  {r / c:>7.1f}x")


def _fmt(seconds: float) -> str:
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    if seconds >= 1e-6:
        return f"{seconds * 1e6:.2f} us"
    return f"{seconds * 1e9:.0f} ns"
