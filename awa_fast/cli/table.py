"""The command table's vocabulary and the argparse parsers built from it.

Each command is declared once, as a :class:`Command` (its name, help, description, arguments
and handler) next to its handler in the area's module; a :class:`Group` is a command with
subcommands (``job``, ``queue``, ...). :func:`add_commands` turns a table of them into
argparse subparsers, so every command gets the same common options, the same usage-error
handling and ``func`` / ``parser`` in its namespace.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn

from awa_fast.cli.errors import UsageError
from awa_fast.cli.options import DB_HELP, LOG_FORMAT_HELP, LOG_FORMATS, SCHEMA_HELP, TRACEBACK_HELP

JSON_HELP = "print machine-readable JSON instead of tables/text"


class Parser(argparse.ArgumentParser):
    """An argparse parser whose usage errors raise :class:`UsageError` (``main`` reports it in
    the requested format) instead of printing and exiting 2."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message, self)


@dataclass(frozen=True)
class Arg:
    """One ``add_argument`` call: its option strings (or positional name) and keywords."""

    flags: tuple[str, ...]
    options: dict[str, Any]


def arg(*flags: str, **options: Any) -> Arg:
    """An argument of a command, given as to ``ArgumentParser.add_argument``."""
    return Arg(flags, options)


@dataclass(frozen=True)
class Common:
    """Which common options (accepted both before and after the command) a command takes.

    ``db``: ``--database-url`` (with ``db_help``) and ``--schema``; ``json``: ``--json`` (a
    command that prints no data does not offer it; one given before it is refused by the
    handler). ``--log-format`` and ``--traceback`` always."""

    db: bool = True
    db_help: str = DB_HELP
    json: bool = True


COMMON = Common()
COMMON_NO_DB = Common(db=False)


@dataclass(frozen=True)
class Command:
    """A command that runs a handler.

    ``handler`` gets the :class:`~awa_fast.cli.session.Session` (a coroutine function runs in
    an event loop); ``help`` is its line in the parent's list (None: the command is hidden);
    ``raw`` keeps the description's line breaks; ``common`` None: no common options (``bench``,
    whose arguments go to the suite)."""

    name: str
    handler: Callable[..., Any]
    help: str | None
    description: str | None = None
    args: tuple[Arg, ...] = ()
    common: Common | None = COMMON
    raw: bool = False
    epilog: str | None = None
    add_help: bool = True


@dataclass(frozen=True)
class Group:
    """A command made of subcommands (``awa-fast job list``); ``dest`` names the chosen one."""

    name: str
    help: str
    description: str
    dest: str
    commands: tuple[Command, ...] = field(default=())


def _common_parser(common: Common) -> Parser:
    """The parent parser of ``common``'s options (SUPPRESS keeps a value given before the
    command when it is not given again after it)."""
    p = Parser(add_help=False)
    g = p.add_argument_group("common options")
    if common.json:
        g.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help=JSON_HELP)
    g.add_argument(
        "--log-format", choices=LOG_FORMATS, default=argparse.SUPPRESS, help=LOG_FORMAT_HELP
    )
    if common.db:
        g.add_argument(
            "--database-url", metavar="URL", default=argparse.SUPPRESS, help=common.db_help
        )
        g.add_argument("--schema", metavar="NAME", default=argparse.SUPPRESS, help=SCHEMA_HELP)
    g.add_argument(
        "--traceback", action="store_true", default=argparse.SUPPRESS, help=TRACEBACK_HELP
    )
    return p


def _add_command(sub: Any, command: Command, parents: Callable[[Common], Parser]) -> None:
    kwargs: dict[str, Any] = {
        "parents": [] if command.common is None else [parents(command.common)],
        "add_help": command.add_help,
    }
    if command.help is not None:
        kwargs["help"] = command.help
    for key in ("description", "epilog"):
        if getattr(command, key) is not None:
            kwargs[key] = getattr(command, key)
    if command.raw:
        kwargs["formatter_class"] = argparse.RawDescriptionHelpFormatter
    p = sub.add_parser(command.name, **kwargs)
    for a in command.args:
        p.add_argument(*a.flags, **a.options)
    p.set_defaults(func=command.handler, parser=p)
    if command.help is None:  # hidden: not listed in the parent's help
        sub._choices_actions = [c for c in sub._choices_actions if c.dest != command.name]


def add_commands(parser: argparse.ArgumentParser, table: tuple[Command | Group, ...]) -> None:
    """Add ``table``'s commands to ``parser`` as its required ``COMMAND``, in table order."""
    cache: dict[Common, Parser] = {}

    def parents(common: Common) -> Parser:
        if common not in cache:
            cache[common] = _common_parser(common)
        return cache[common]

    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, title="commands")
    for entry in table:
        if isinstance(entry, Command):
            _add_command(sub, entry, parents)
            continue
        group = sub.add_parser(entry.name, help=entry.help, description=entry.description)
        gsub = group.add_subparsers(
            dest=entry.dest, metavar="SUBCOMMAND", required=True, title="subcommands"
        )
        for command in entry.commands:
            _add_command(gsub, command, parents)
