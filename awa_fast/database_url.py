"""Which PostgreSQL to use: the one rule shared by the library, the CLI and the launcher.

In order: an explicit URL (``AsyncClient(url)`` / ``Client(url)``, ``--database-url``), else
``$AWA_FAST_DATABASE_URL``, else ``$DATABASE_URL``, else the persistent embedded PostgreSQL
(:func:`awa_fast.embedded.ensure_running`, started on first use).
"""

from __future__ import annotations

import os

#: Environment variables consulted, in order, when no URL is given explicitly.
ENV_VARS = ("AWA_FAST_DATABASE_URL", "DATABASE_URL")


def from_environment() -> str | None:
    """The first non-empty of :data:`ENV_VARS`, or ``None``."""
    for var in ENV_VARS:
        value = os.environ.get(var)
        if value:
            return value
    return None


def resolve_database_url(explicit: str | None = None) -> str:
    """``explicit`` if given, else :func:`from_environment`, else the embedded server's URL.

    Raises:
        EmbeddedPostgresError: no URL is configured and the embedded server could not start.
    """
    if explicit:
        return explicit
    value = from_environment()
    if value:
        return value
    from awa_fast import embedded

    return embedded.ensure_running()


def url_source(explicit: str | None = None) -> str:
    """Where :func:`resolve_database_url` (``explicit``) takes its URL from, for an error
    message: ``"given explicitly"``, ``"from $AWA_FAST_DATABASE_URL"``, ``"from
    $DATABASE_URL"`` or ``"of the embedded server"``."""
    if explicit:
        return "given explicitly"
    for var in ENV_VARS:
        if os.environ.get(var):
            return f"from ${var}"
    return "of the embedded server"
