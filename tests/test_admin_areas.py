"""The client is a facade over the admin areas (issue 10): no area imports the client, every
admin method of AsyncClient is one written-out call to the area method of the same name, and
every public area method is reached from the client. No database: sources are parsed."""

from __future__ import annotations

import ast
import inspect
import textwrap
from pathlib import Path

import awa_fast.admin as admin
from awa_fast.client import AsyncClient

ADMIN_DIR = Path(admin.__file__).parent
AREAS = {
    "_jobs": admin.JobAdmin,
    "_queues": admin.QueueAdmin,
    "_health": admin.HealthAdmin,
    "_cron": admin.CronAdmin,
    "_callbacks": admin.CallbackAdmin,
    "_consequences": admin.ConsequenceAdmin,
    "_dlq": admin.DlqAdmin,
    "_storage": admin.StorageAdmin,
    "_batches": admin.BatchAdmin,
}
# CallbackAdmin's own members that make it the CallbackDeps its operations run with.
DEPS_MEMBERS = {"pool", "staleness_ms", "specs", "settler"}


def test_no_admin_area_imports_the_client():
    for path in ADMIN_DIR.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                assert node.module not in ("awa_fast.client", "awa_fast.sync_client"), path
                if node.module == "awa_fast":
                    assert not {a.name for a in node.names} & {"client", "sync_client"}, path
            elif isinstance(node, ast.Import):
                assert not any(a.name.startswith("awa_fast.client") for a in node.names), path


def _delegation(fn) -> tuple[str, str] | None:
    """``(area attribute, method)`` when ``fn``'s body (after its docstring) is one
    ``return [await] self.<area>.<method>(...)``."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    body = tree.body[0].body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    if len(body) != 1 or not isinstance(body[0], ast.Return):
        return None
    call = body[0].value
    if isinstance(call, ast.Await):
        call = call.value
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)):
        return None
    owner = call.func.value
    if not (
        isinstance(owner, ast.Attribute)
        and isinstance(owner.value, ast.Name)
        and owner.value.id == "self"
    ):
        return None
    return owner.attr, call.func.attr


def test_admin_methods_delegate_to_the_area_method_of_the_same_name():
    reached: dict[str, set[str]] = {area: set() for area in AREAS}
    for name, fn in vars(AsyncClient).items():
        if name.startswith("_") or not inspect.isfunction(fn):
            continue
        target = _delegation(fn)
        if target is None or target[0] not in AREAS:
            continue
        area, method = target
        assert method == name, f"AsyncClient.{name} calls {area}.{method}"
        area_fn = getattr(AREAS[area], method)
        assert [p.name for p in inspect.signature(area_fn).parameters.values()] == [
            p.name for p in inspect.signature(fn).parameters.values()
        ], name
        reached[area].add(name)
    for area, cls in AREAS.items():
        public = {n for n in vars(cls) if not n.startswith("_")}
        if cls is admin.CallbackAdmin:
            public -= DEPS_MEMBERS
        assert public == reached[area], f"{cls.__name__} methods the client does not reach"


def test_admin_methods_are_not_inherited():
    # the facade writes every admin method out: no mixin supplies one
    assert AsyncClient.__bases__ == (object,)
