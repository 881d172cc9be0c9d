"""The client's surface is declared once and derived (ADR 041): every public method of an admin
area (and of the producer) is exposed on AsyncClient under its own name, every AsyncClient
method but the worker-side ones has a typed blocking twin on Client, and every Client method
is such a twin; SyncTransaction likewise for Transaction. No database: classes are inspected."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import awa_fast.admin as admin
from awa_fast.client import AsyncClient
from awa_fast.producer import Producer
from awa_fast.sync_client import ASYNC_ONLY, Client, SyncTransaction
from awa_fast.transaction import Transaction
from awa_fast.twins import owner_class

COMPONENTS = (
    Producer,
    admin.JobAdmin,
    admin.QueueAdmin,
    admin.HealthAdmin,
    admin.CronAdmin,
    admin.CallbackAdmin,
    admin.ConsequenceAdmin,
    admin.DlqAdmin,
    admin.StorageAdmin,
    admin.BatchAdmin,
)
# Public members of a component that are not client methods: what makes CallbackAdmin the
# CallbackDeps its operations run with, the producer's waker and warning hook.
NOT_EXPOSED = {
    admin.CallbackAdmin: {"pool", "staleness_ms", "specs", "settler"},
    Producer: {"waker"},
}
# Client members that are its own (lifecycle, accessors), not twins of an async method.
SYNC_OWN = {"close", "async_client", "schema"}
# Twins written out, with why: staleness_ms is no coroutine (nothing to block on); transaction
# returns a SyncTransaction around the async one.
WRITTEN_OUT = {"staleness_ms", "transaction"}


def _public(cls: type) -> dict:
    return {n: v for n, v in vars(cls).items() if not n.startswith("_")}


def _methods(cls: type) -> dict:
    return {n: f for n, f in inspect.getmembers(cls, callable) if not n.startswith("_")}


def _params(fn) -> list:
    """Parameters after ``self``: name, kind, default and annotation."""
    return [
        (p.name, p.kind, p.default, p.annotation)
        for p in list(inspect.signature(fn).parameters.values())[1:]
    ]


def _wraps_chain(fn) -> list:
    chain = [fn]
    while hasattr(chain[-1], "__wrapped__"):
        chain.append(chain[-1].__wrapped__)
    return chain


def test_no_admin_area_imports_the_client():
    for path in Path(admin.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                assert node.module not in ("awa_fast.client", "awa_fast.sync_client"), path
                if node.module == "awa_fast":
                    assert not {a.name for a in node.names} & {"client", "sync_client"}, path
            elif isinstance(node, ast.Import):
                assert not any(a.name.startswith("awa_fast.client") for a in node.names), path


def test_every_component_method_is_exposed_once_under_its_own_name():
    exposed: dict[type, set[str]] = {cls: set() for cls in COMPONENTS}
    for name, fn in _public(AsyncClient).items():
        chain = _wraps_chain(fn)
        if len(chain) < 2 or not inspect.isfunction(chain[-1]):
            continue
        try:
            owner = owner_class(chain[-1])
        except TypeError:
            continue
        if owner is AsyncClient:
            continue
        assert owner in exposed, f"AsyncClient.{name} exposes {owner.__name__}"
        assert chain[-1].__name__ == name, f"AsyncClient.{name} exposes {chain[-1].__qualname__}"
        assert inspect.iscoroutinefunction(fn), name
        exposed[owner].add(name)
    for cls in COMPONENTS:
        public = {n for n in _public(cls) if callable(getattr(cls, n))} - NOT_EXPOSED.get(
            cls, set()
        )
        assert public == exposed[cls], f"{cls.__name__} methods the client does not expose"
    assert AsyncClient.__bases__ == (object,)  # no mixin supplies a method
    client = AsyncClient()  # no URL: nothing connects before a call
    assert set(client._components) == set(COMPONENTS)


def test_every_async_method_has_a_typed_sync_twin_and_back():
    assert "__getattr__" not in vars(AsyncClient)
    for cls in (Client, SyncTransaction):
        assert "__getattr__" not in vars(cls) and "__getattribute__" not in vars(cls)
    async_methods = {n: f for n, f in _methods(AsyncClient).items() if n not in ASYNC_ONLY}
    sync_members = {n for n in _public(Client) if n not in SYNC_OWN}
    assert set(async_methods) - {"close"} == sync_members, "twins missing or without a source"
    assert ASYNC_ONLY <= set(_methods(AsyncClient)) and not ASYNC_ONLY & set(_public(Client))
    for name in sync_members:
        twin, source = vars(Client)[name], async_methods[name]
        assert inspect.isfunction(twin) and not inspect.iscoroutinefunction(twin), name
        if name in WRITTEN_OUT:
            assert twin.__code__.co_filename.endswith("sync_client.py"), name
        else:  # derived by twins.blocking from the async method: its type follows that one
            assert getattr(twin, "__wrapped__", None) is source, name
            assert twin.__doc__ == source.__doc__, name
        assert _params(twin) == _params(source), name


def test_sync_transaction_twins_every_transaction_method():
    tx_async = _methods(Transaction)
    tx_sync = {n: f for n, f in _public(SyncTransaction).items() if not isinstance(f, property)}
    assert set(tx_async) == set(tx_sync)
    for name, source in tx_async.items():
        twin = tx_sync[name]
        assert getattr(twin, "__wrapped__", None) is source, name
        assert _params(twin) == _params(source), name


def test_every_derived_method_carries_its_attribute_name():
    # a factory's name (variants' "on_{}_enqueue", expose's area method) is the attribute's
    for cls in (AsyncClient, Client, SyncTransaction):
        for name, fn in _public(cls).items():
            if inspect.isfunction(fn):
                assert fn.__name__ == name, f"{cls.__name__}.{name} is named {fn.__name__}"
