"""``awa-fast bench``: the benchmark suite of a source checkout (bench/); every argument after
``bench`` goes to the suite's own parser."""

from __future__ import annotations

import argparse
import sys

from awa_fast.cli.errors import CliError
from awa_fast.cli.output import PROG
from awa_fast.cli.session import Session
from awa_fast.cli.table import Command, arg


def _names_database_url(arg: str) -> bool:
    # --database-url, --database-url=..., or an abbreviation the suite's parser takes for it
    name = arg.split("=", 1)[0]
    return name.startswith("--da") and "--database-url".startswith(name)


def cmd_bench(s: Session) -> int:
    from pathlib import Path

    if s.json:  # the suite's options follow 'bench'; a --json before it would go unread
        s.args.parser.error("--json does not apply to bench (its results are JSONL: --out)")
    if s.args.log_format != "text":  # the suite prints its own report lines, not log records
        s.args.parser.error("--log-format does not apply to bench (its report is plain text)")

    root = Path(__file__).resolve().parents[2]  # the checkout: awa_fast/cli/bench.py
    if not (root / "bench" / "runner.py").is_file():
        raise CliError(
            "the benchmark suite ships with the source checkout: run `awa-fast bench` "
            "from an editable install (pip install -e .) of the repository"
        )
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    from bench.runner import main as bench_main

    bench_args = list(s.args.bench_args)
    if bench_args[:1] == ["--"]:
        bench_args = bench_args[1:]
    url = s.args.database_url
    if url is not None:  # given before 'bench': the suite's own --database-url
        if any(_names_database_url(a) for a in bench_args):
            s.args.parser.error("--database-url is given both before and after 'bench'")
        bench_args = ["--database-url", url, *bench_args]
    return bench_main(bench_args, prog=f"{PROG} bench")


BENCH = Command(
    "bench",
    cmd_bench,
    help="run the benchmark suite (bench/; a source checkout, pip install -e .)",
    description="Run the end-to-end benchmark suite in bench/ (from a source "
    "checkout). Arguments after 'bench' go to the suite: see "
    "`awa-fast bench --help`, e.g. --compare --plot.",
    common=None,
    add_help=False,
    args=(
        arg(
            "bench_args",
            nargs=argparse.REMAINDER,
            metavar="ARGS",
            help="arguments for the suite (--compare, --scenarios, --jobs, --plot, ...)",
        ),
    ),
)
