"""awa-pg's ``RawClient``: the :class:`~awa_fast.client.AsyncClient` plus the blocking
``<method>_sync`` twins of awa-pg's native client (its legacy suffixed API, which awa-pg's
``awa.RawClient`` documents as kept "for legacy code that uses the ``_sync`` method suffixes").

``RawClient(url).complete_external_sync(callback_id)`` is
``Client(url).complete_external(callback_id)``: each ``_sync`` method runs the method of the same
name of :class:`~awa_fast.sync_client.Client` (same parameters, same errors), on one blocking
client opened on first use for the same database URL (its own pool and loop thread, so a call
from a coroutine blocks that loop as awa-pg's do, without deadlocking on it). The same twins are
reachable from any :class:`AsyncClient` as ``client._raw``, the attribute through which awa-pg's
wrapper reaches its native client. :meth:`AsyncClient.close` closes that blocking client.
"""

from __future__ import annotations

import threading
from typing import Any

from awa_fast.client import AsyncClient
from awa_fast.sync_client import Client

# Client methods with no ``_sync`` twin: its own lifecycle and accessor.
NOT_TWINNED = frozenset({"close", "async_client"})

SYNC_TWINS = tuple(
    sorted(
        name
        for name, fn in vars(Client).items()
        if callable(fn) and not name.startswith("_") and name not in NOT_TWINNED
    )
)


class SyncTwins:
    """The ``<name>_sync`` methods (one per name in :data:`SYNC_TWINS`) of one
    :class:`AsyncClient`, run on a blocking :class:`Client` for its database URL, opened on
    the first call (raises what ``Client(url)`` raises: ``DatabaseError`` when unreachable)."""

    def __init__(self, owner: AsyncClient):
        self._owner = owner
        self._client: Client | None = None
        self._lock = threading.Lock()

    def _blocking(self) -> Client:
        with self._lock:
            if self._client is None:
                client = Client(self._owner.database_url, self._owner.max_connections)
                # The same client's twins: they know the kinds the owner registers (handlers,
                # failure consequences, callback specs), so a failure the owner would settle
                # is settled, not left owed for another process.
                inner, owner = client.async_client, self._owner
                inner.registry, inner.specs = owner.registry, owner.specs
                inner.consequences, inner.settler = owner.consequences, owner.settler
                self._client = client
            return self._client

    def close(self) -> None:
        """Close the blocking client if one was opened (idempotent)."""
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()


def _twin(name: str) -> Any:
    blocking = getattr(Client, name)

    def method(self: SyncTwins, *args: Any, **kwargs: Any) -> Any:
        return blocking(self._blocking(), *args, **kwargs)

    method.__name__ = method.__qualname__ = f"{name}_sync"
    method.__doc__ = f"Blocking twin of ``{name}`` (:meth:`Client.{name}`).\n\n" + (
        blocking.__doc__ or ""
    )
    return method


def _delegate(name: str) -> Any:
    def method(self: AsyncClient, *args: Any, **kwargs: Any) -> Any:
        return getattr(self._raw, f"{name}_sync")(*args, **kwargs)

    method.__name__ = method.__qualname__ = f"{name}_sync"
    method.__doc__ = getattr(SyncTwins, f"{name}_sync").__doc__
    return method


for _name in SYNC_TWINS:
    setattr(SyncTwins, f"{_name}_sync", _twin(_name))


class RawClient(AsyncClient):
    """awa-pg's ``RawClient``: an :class:`AsyncClient` (same constructor, same async methods)
    that also has the blocking ``<method>_sync`` twin of every :class:`Client` method but
    ``close`` (see the module's docstring)."""


for _name in SYNC_TWINS:
    setattr(RawClient, f"{_name}_sync", _delegate(_name))
