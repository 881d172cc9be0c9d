"""awa's CLI command set (its `python -m awa`: migrate, job, queue, dlq, cron, storage, serve)
is present in `awa-fast`, with awa's `storage status` report and its help description."""

from __future__ import annotations

from tests.cli.test_cli import cli, ok_json


def test_help_names_awa_command_groups_and_description():
    r = cli("--help")
    assert r.returncode == 0, r.stderr
    assert "Awa job queue CLI" in r.stdout
    for group in ("migrate", "job", "queue", "dlq", "cron", "storage", "serve"):
        assert group in r.stdout, group
    r = cli("storage", "--help")
    assert r.returncode == 0 and "status" in r.stdout, r.stderr


def test_storage_status_prints_the_storage_report(dsn):
    report = ok_json("storage", "status", dsn=dsn)
    assert report["current_engine"] == report["active_engine"] == "awa_fast"
    assert report["state"] == "active" and report["can_finalize"] is False
    r = cli("storage", "status", dsn=dsn)  # without --json: the same report, as JSON text
    assert r.returncode == 0 and '"current_engine": "awa_fast"' in r.stdout, r.stderr
    r = cli("storage", dsn=dsn)
    assert r.returncode == 2 and "SUBCOMMAND" in r.stderr, r.stderr
