"""The checks that a queue or kind named on the command line is one something knows of: a typo
gets the closest known names ("did you mean"), not an empty answer or a new stored name."""

from __future__ import annotations

import sys
from typing import Any

from awa_fast.cli.errors import CliError
from awa_fast.cli.output import PROG
from awa_fast.cli.session import Session
from awa_fast.errors import ValidationError
from awa_fast.repo.names import NamesRepo
from awa_fast.requests import check_name


def unknown_name(what: str, name: str, names: list[str], by: str, suffix: str = "") -> CliError:
    """The error for a ``what`` (``"queue"``, ``"kind"``) named ``name`` that nothing knows
    of (``by`` says what was looked at), with the closest of ``names`` (difflib) or the known
    ones as a hint."""
    import difflib

    close = difflib.get_close_matches(name, names, n=3, cutoff=0.6)
    if close:
        hint = f"; did you mean {' or '.join(repr(n) for n in close)}?"
    elif names:
        hint = f"; known {what}s: {', '.join(names[:10])}{', ...' if len(names) > 10 else ''}"
    else:
        hint = f"; no {what} is known yet"
    return CliError(f"no {what} named {name!r} ({by}){hint}{suffix}")


async def known_queue(client: Any, queue: str, *, create_flag: str | None = None) -> None:
    """Raise :class:`CliError` unless ``queue`` is a queue something knows of
    (``sql.KNOWN_QUEUES``: jobs, its settings row, a worker, a schedule, a descriptor), with the
    closest known names as a hint; ``create_flag`` names the option that allows a new name.
    The library's calls stay permissive, as awa-pg's (docs/adr/026)."""
    queue.encode()  # not UTF-8 (a lone surrogate from argv): the UnicodeEncodeError's message
    check_name(queue, "queue")  # a name no queue can have: the rule, not a "did you mean"
    async with (await client.pool()).connection() as conn:
        names = await NamesRepo(conn).queues()
    if queue not in names:
        by = "no job, worker, schedule or setting names it"
        create = f" ({create_flag} uses a new name)" if create_flag else ""
        raise unknown_name("queue", queue, names, by, create)


async def known_kind(client: Any, kind: str) -> None:
    """Raise :class:`CliError` unless some job (live, finished or dead-lettered), worker,
    schedule or descriptor has ``kind``, with the closest known kinds as a hint."""
    kind.encode()  # as known_queue
    check_name(kind, "kind")
    async with (await client.pool()).connection() as conn:
        repo = NamesRepo(conn)
        names = await repo.kinds()
        known = kind in names or await repo.kind_finished(kind)
    if not known:
        raise unknown_name("kind", kind, names, "no job, worker or schedule has it")


async def note_unknown_filter(
    s: Session, client: Any, *, queue: str | None = None, kind: str | None = None
) -> None:
    """For a listing that came back empty: when its ``queue`` or ``kind`` filter names nothing
    known, say so on stderr with the closest known names (``awa-fast: note: ...``). The listing
    stays an empty answer with exit status 0; with ``--json`` stderr carries error objects
    only, so nothing is printed."""
    if s.json:
        return
    try:
        if queue is not None:
            await known_queue(client, queue)
        if kind is not None:
            await known_kind(client, kind)
    except ValidationError:  # a name nothing can have: the empty listing says it all
        return
    except CliError as exc:
        print(f"{PROG}: note: {exc}", file=sys.stderr)
