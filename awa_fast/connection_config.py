"""How a client reaches its database: one frozen :class:`ConnectionConfig` (the URL, the pool
size, the connection mode of ADR 028 and the schema of ADR 027), built and validated once by
:func:`connection_config` from ``AsyncClient(...)``'s arguments and the environment
(``$AWA_FAST_POOLER``, ``$AWA_FAST_SCHEMA``; ADR 040)."""

from __future__ import annotations

import dataclasses
from typing import Any

from awa_fast import pooler as pooler_mode
from awa_fast import primary, schema_binding
from awa_fast.config_fields import doc
from awa_fast.errors import ConfigError, ValidationError


@dataclasses.dataclass(frozen=True)
class ConnectionConfig:
    """A client's connection settings, validated."""

    database_url: str | None = doc(
        None, "URL", "the explicit URL; None = resolved at first use (environment, embedded)"
    )
    max_connections: int = doc(10, "connections", "the pool's size (the runtime opens 3 more)")
    pooler: str | None = doc(
        None, "mode", "None (direct), 'session' or 'transaction': the pooler's pool mode"
    )
    listen_url: str | None = doc(
        None, "URL", "pooler='transaction' only: a direct URL for LISTEN; None = polling"
    )
    schema: schema_binding.SchemaBinding = doc(
        schema_binding.DEFAULT, "schema", "where every awa-fast object of the client lives"
    )


def connection_config(
    database_url: str | None = None,
    max_connections: Any = 10,
    *,
    pooler: Any = None,
    listen_url: Any = None,
    schema: str | None = None,
) -> ConnectionConfig:
    """``AsyncClient(database_url, max_connections, pooler=, listen_url=, schema=)`` validated:
    ``pooler`` None takes ``$AWA_FAST_POOLER``, ``schema`` None ``$AWA_FAST_SCHEMA`` (else
    ``awa_fast``).

    Raises:
        ValidationError: ``max_connections`` < 1; a ``schema`` (or ``$AWA_FAST_SCHEMA``) that
            breaks the schema-name rule (naming the field).
        ConfigError: ``pooler`` (or ``$AWA_FAST_POOLER``) not ``None``, ``"session"`` or
            ``"transaction"``; ``listen_url`` not a non-empty str, or given without
            ``pooler="transaction"``; a URL of several hosts ``primary.check_url`` refuses.
    """
    if not isinstance(max_connections, int) or max_connections < 1:
        raise ValidationError(
            "max_connections must be an int >= 1", field="max_connections", limit=">= 1"
        )
    if pooler is None:
        pooler = pooler_mode.from_env()
    pooler = pooler_mode.check_setting(pooler, listen_url)
    if listen_url is not None and pooler != "transaction":
        raise ConfigError(
            f"listen_url is for pooler='transaction' (pooler={pooler!r}: the runtime "
            "listens on its own connection to database_url)",
            field="listen_url",
            limit="only with pooler='transaction'",
        )
    for field, given in (("database_url", database_url), ("listen_url", listen_url)):
        if given:  # several hosts: only where libpq keeps a writable one (primary.py)
            primary.check_url(given, field)
    return ConnectionConfig(
        database_url=database_url or None,
        max_connections=max_connections,
        pooler=pooler,
        listen_url=listen_url,
        schema=schema_binding.resolve(schema),
    )
