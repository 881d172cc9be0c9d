"""awa-fast benchmark suite: ``python -m bench --help`` (see docs/benchmarking.md)."""
