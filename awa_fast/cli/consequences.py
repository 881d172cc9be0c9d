"""Failure consequences: ``awa-fast check`` (an application's declarations and start()
configuration, without starting it) and ``awa-fast consequences`` (the consequences owed)."""

from __future__ import annotations

import contextlib
from typing import Any

from awa_fast.cli.options import positive_int
from awa_fast.cli.output import PROG, print_json, stdout_to_stderr
from awa_fast.cli.session import Session
from awa_fast.cli.table import COMMON_NO_DB, Command, arg


def _load(s: Session) -> tuple[Any, Any] | int:
    """Import ``s.args.app``: its client and module, or the exit status after reporting why
    it could not be imported (2 a bad spec, 1 an import that exits or raises)."""
    from awa_fast.app_loader import (
        AppSpecError,
        exits_at_import,
        format_traceback,
        import_failure,
        load_client,
    )

    try:
        # Under --json stdout is the JSON object only: what the application writes there while
        # it imports goes to stderr.
        with stdout_to_stderr() if s.json else contextlib.nullcontext():
            return load_client(s.args.app)
    except AppSpecError as exc:  # a usage error, as `awa-fast worker` reports it
        return s.fail(str(exc), status=2, kind="AppSpecError", text=f"{PROG} check: error: {exc}")
    except SystemExit as exc:  # the module ends its program at import: nothing was checked
        message = exits_at_import(s.args.app, exc)
        return s.fail(message, kind="SystemExit", text=f"{PROG} check: error: {message}")
    except Exception as exc:  # the application's own import raised
        # One line (what, where, how to see more); the traceback only when asked for.
        message = import_failure(s.args.app, exc)
        trace = format_traceback(exc)
        text = f"{PROG} check: error: {message}"
        return s.fail(
            import_failure(s.args.app, exc, traceback_hint=False),  # --json: "traceback" has it
            kind=type(exc).__name__,
            text=f"{text}\n{trace}" if s.debug else text,
            traceback=trace,
        )


def _findings(client: Any, module: Any) -> dict[str, Any]:
    """What ``check`` reports about an imported application (its ``--json`` object)."""
    import warnings

    from awa_fast import storage_options
    from awa_fast.app_loader import start_config_error, start_options
    from awa_fast.errors import QueueMismatchWarning

    kinds = client.registry.undeclared_kinds()
    off_default = dict(sorted(client.registry.off_default.items()))
    # What start() would warn about, as lines of the report (Python's warning display points
    # at this module's line, two lines each); the warning filters apply.
    with warnings.catch_warnings(record=True) as caught:
        config_error = start_config_error(client, module)
    mismatches = [str(w.message) for w in caught if issubclass(w.category, QueueMismatchWarning)]
    for w in caught:
        if not issubclass(w.category, QueueMismatchWarning):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    try:
        given = start_options(module)
    except ValueError:  # already reported as the config error
        given = {}
    # awa storage options START_OPTIONS gives that tune a mechanism awa-fast does not have
    no_effect = [
        {"option": o.name, "value": given[o.name], "reason": o.here}
        for o in storage_options.inapplicable_given(given)
    ]
    return {
        "undeclared": kinds,
        "registered": sorted(client.registry.handlers),
        "registered_off_default": off_default,
        "config_error": config_error,
        "warnings": mismatches,
        "no_effect_options": no_effect,
    }


def _print_findings(found: dict[str, Any], module: Any) -> None:
    """``check``'s report as text lines."""
    for message in found["warnings"]:
        print(f"warning: {message}")
    n = len(found["registered"])
    if found["config_error"]:
        print(f"start() would reject this configuration: {found['config_error']}")
    else:
        with_options = ", START_OPTIONS included" if getattr(module, "START_OPTIONS", None) else ""
        print(
            f"start() would accept this configuration ({n} registered "
            f"{'kind' if n == 1 else 'kinds'}{with_options})"
        )
    if found["no_effect_options"]:
        print("START_OPTIONS accepted with no effect in awa-fast (awa storage options):")
        for item in found["no_effect_options"]:
            print(f"  {item['option']}={item['value']!r}: {item['reason']}")
    if found["undeclared"]:
        print(
            "kinds without a failure consequence declaration "
            "(failure_consequence=fn or awa_fast.NO_FAILURE_CONSEQUENCE):"
        )
        for kind in found["undeclared"]:
            print(f"  {kind}")
    else:
        print(
            "no kinds are registered"
            if n == 0
            else "the registered kind declares a failure consequence"
            if n == 1
            else f"all {n} registered kinds declare a failure consequence"
        )
    if found["registered_off_default"]:
        print(
            "note: kinds registered for a queue other than 'default': insert them with that "
            "queue=,\nelse they go to 'default' (awa-pg semantics), which a worker of the "
            "registered queues does not work:"
        )
        for kind, queue in found["registered_off_default"].items():
            print(f"  {kind} -> queue {queue}")


def cmd_check(s: Session) -> int:
    loaded = _load(s)
    if isinstance(loaded, int):
        return loaded
    client, module = loaded
    found = _findings(client, module)
    if s.json:
        print_json(found)
    else:
        _print_findings(found, module)
    return 1 if found["undeclared"] or found["config_error"] else 0


async def cmd_consequences(s: Session) -> int:
    client = await s.client()
    rows = await client.consequences_owed(limit=s.args.limit)
    s.listing(
        rows,
        ["id", "kind", "queue", "state", "reason", "path", "attempts", "overdue", "error"],
        [
            [
                r["id"],
                r["kind"],
                r["queue"],
                r["state"],
                r["reason"],
                r["path"],
                r["attempts"],
                "yes" if r["overdue"] else "no",
                (r["error"] or "")[:60],
            ]
            for r in rows
        ],
        "no failure consequence is owed",
    )
    return 0


CHECK = Command(
    "check",
    cmd_check,
    help="check an application without starting it: failure consequences, "
    "start() configuration, queues",
    description="Import APP (module:client) without starting it or touching "
    "the database, and report: every registered kind without a "
    "failure-consequence declaration; the error that "
    "client.start(**START_OPTIONS) would raise (a ConfigError: no "
    "handlers, a handler's queue not started, heartbeat settings, a "
    "name insert would reject; a TypeError: an unknown option); and, as a note, the "
    "kinds registered for a queue other than 'default' and what start() would warn "
    "about (QueueMismatchWarning: 'warning:' lines; --json: \"warnings\") (an insert "
    "without queue= puts them in 'default', which the registered "
    "queues' workers do not work). Exit 0 when all is well, 1 when "
    "a kind is undeclared, start() would fail or importing APP "
    "raises, 2 when APP names no module or no AsyncClient.",
    common=COMMON_NO_DB,
    args=(arg("app", metavar="APP", help="the application, as package.module:client"),),
)

CONSEQUENCES = Command(
    "consequences",
    cmd_consequences,
    help="list jobs whose failure consequence is owed (pending or overdue)",
    description="List jobs whose failure consequence is still owed: failures "
    "waiting in consequence_pending and corrected jobs; 'overdue' "
    "means an application already failed or it waited > 60 s.",
    args=(
        arg(
            "--limit",
            type=positive_int,
            default=100,
            metavar="N",
            help="most rows to show (default: 100)",
        ),
    ),
)
