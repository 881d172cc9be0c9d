"""``awa-fast demo``: the built-in two-stage pipeline over the standard library
(:mod:`awa_fast.demo`)."""

from __future__ import annotations

from awa_fast.cli.options import positive_float, positive_int
from awa_fast.cli.session import Session
from awa_fast.cli.table import Command, arg
from awa_fast.cli.worker import PROCESSES


def cmd_demo(s: Session) -> int:
    from awa_fast.demo import run_demo

    return run_demo(
        getattr(s.args, "database_url", None),
        processes=s.args.processes,
        limit=s.args.limit,
        extra_paths=s.args.extra_path or [],
        timeout=s.args.timeout,
        json_output=s.json,
    )


DEMO = Command(
    "demo",
    cmd_demo,
    help="import-graph pipeline over this Python's standard library",
    description="Run the built-in demo: a two-stage pipeline over the "
    "standard library of the running Python.\nStage A "
    "(demo_parse_imports), one job per .py file, parses its "
    "imports and stages one\nstage-B job (demo_resolve_module) "
    "per imported top-level module with default unique\noptions, "
    "so each distinct module gets exactly one B. Stage B resolves "
    "the module\n(found or not, file size). Workers run in "
    "--processes worker processes (the launcher).\nPrints files, "
    "failures, distinct modules, B jobs inserted vs skipped as "
    "duplicates,\nwall time and jobs/s, and checks the B count "
    "against a direct computation (exit 1 on\nmismatch). Rows of "
    "a previous demo run are deleted first.\nCtrl-C (or SIGTERM, SIGHUP) "
    "drains the workers, deletes the demo's unfinished jobs, prints "
    "a summary\nand exits 130 (143 after SIGTERM, 129 after SIGHUP).\nWithout a "
    "database URL it uses the embedded "
    "server and says so first (data directory,\nserver account; "
    "it keeps running: `awa-fast embedded stop`).",
    raw=True,
    args=(
        PROCESSES,
        arg(
            "--limit",
            type=positive_int,
            default=None,
            metavar="N",
            help="only the first N standard-library files (sorted by path)",
        ),
        arg(
            "--extra-path",
            action="append",
            metavar="PATH",
            help="also process this .py file, or the .py files under this directory (repeatable)",
        ),
        arg(
            "--timeout",
            type=positive_float,
            default=600.0,
            metavar="SECONDS",
            help="give up if the pipeline has not finished after this long: stop the workers, "
            "remove the unfinished jobs, exit 1 (default: 600)",
        ),
    ),
)
