"""What a command handler gets (:class:`Session`: its arguments, a lazily opened client) and
the connection probe that fails fast with the server's message."""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from awa_fast.app_loader import debug_requested, one_line
from awa_fast.cli.errors import CliError
from awa_fast.cli.output import format_table, print_error, print_json
from awa_fast.database_url import resolve_database_url, url_source

if TYPE_CHECKING:
    from awa_fast.client import AsyncClient

CONNECT_TIMEOUT_S = 10

# Connect failures in which the server answered but still takes no connection (libpq's text;
# the connect error has no SQLSTATE): a database coming up or going down, or full.
_NOT_YET = ("starting up", "shutting down", "in recovery", "too many clients")
# How long a probe that waits for the database pauses between its connects.
PROBE_RETRY_S = 0.5


def _refused_for_good(exc: Exception) -> bool:
    """Whether a connect failure came from a server that refuses this login for good (an
    unknown role or database, a wrong password, pg_hba): waiting does not help."""
    text = str(exc)
    return "FATAL:" in text and not any(reason in text for reason in _NOT_YET)


async def probe(url: str, *, need_schema: bool, source: str = "", wait_s: float = 0.0) -> None:
    """Connect once (failing fast with the server's message instead of a pool timeout) and, if
    ``need_schema``, check that the ``awa_fast`` schema is there and current. With ``wait_s``,
    a database that cannot be reached (refused, unreachable, starting up) is tried again for up
    to that many seconds; a server that refuses the login fails at once."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    from awa_fast import schema
    from awa_fast.pg_connection import connection_class
    from awa_fast.schema_binding import resolve

    bound = connection_class(resolve())  # --schema's (or $AWA_FAST_SCHEMA's)
    kwargs: dict[str, Any] = {"autocommit": True}
    try:
        if "connect_timeout" not in conninfo_to_dict(url):
            kwargs["connect_timeout"] = CONNECT_TIMEOUT_S
    except psycopg.ProgrammingError as exc:
        raise CliError(f"invalid database URL: {one_line(str(exc))}") from exc
    deadline = time.monotonic() + wait_s
    while True:
        try:
            conn = await bound.connect(url, **kwargs)
            break
        except psycopg.OperationalError as exc:
            if time.monotonic() + PROBE_RETRY_S < deadline and not _refused_for_good(exc):
                await asyncio.sleep(PROBE_RETRY_S)  # no event says the database is back
                continue
            where = f" (the URL {source})" if source else ""
            # only when it did wait: a refusal for good (no such database, bad password) fails
            # at the first try
            tried = wait_s - max(0.0, deadline - time.monotonic())
            waited = f" (tried for {tried:.0f} s)" if wait_s and tried >= 1 else ""
            raise CliError(
                f"could not connect to the database{where}{waited}: {one_line(str(exc))}"
            ) from exc
    async with conn:
        if need_schema:  # missing, or older than this package (its reads would fail raw)
            await schema.check_current(conn)


class Session:
    """What a command handler gets: the parsed arguments and a lazily opened client."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.json: bool = bool(getattr(args, "json", False))
        # --traceback or $AWA_FAST_DEBUG: an error's whole traceback after its one line
        self.debug: bool = debug_requested(bool(getattr(args, "traceback", False)))
        self._url: str | None = None
        self._client: AsyncClient | None = None

    @property
    def database_url(self) -> str:
        if self._url is None:
            self._url = resolve_database_url(getattr(self.args, "database_url", None))
        return self._url

    @property
    def url_source(self) -> str:
        """Where :attr:`database_url` came from, for error messages."""
        return url_source(getattr(self.args, "database_url", None))

    async def client(self, *, need_schema: bool = True) -> AsyncClient:
        if self._client is None:
            from awa_fast.client import AsyncClient

            url = self.database_url
            await probe(url, need_schema=need_schema, source=self.url_source)
            self._client = AsyncClient(url, max_connections=2)
        return self._client

    def fail(self, message: str, *, status: int = 1, **kw: Any) -> int:
        """Print an error (``--json``: as JSON, see :func:`~awa_fast.cli.output.print_error` for ``kw``) and return
        ``status``, the exit status."""
        print_error(message, json_output=self.json, **kw)
        return status

    def report(self, data: Any, text: str) -> int:
        """Print ``data`` as JSON with ``--json``, else ``text``; returns 0, the exit status."""
        if self.json:
            print_json(data)
        else:
            print(text)
        return 0

    def listing(
        self, data: Any, headers: Sequence[str], rows: Sequence[Sequence[Any]], empty: str
    ) -> None:
        """A list's output: ``data`` as JSON with ``--json``, else ``rows`` as a table under
        ``headers``, or the line ``empty`` when there are no rows."""
        if self.json:
            print_json(data)
        elif rows:
            print(format_table(headers, rows))
        else:
            print(empty)

    async def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.close()


# ---------------------------------------------------------------------------------------------
# commands
