"""The one importer of the compiled ``_ext`` modules (built from ``_ext/*.pyx`` at install time).

There is no silent pure-Python fallback: if the extensions are missing the package fails to import
with an error that says how to build them. :func:`native_extensions` reports what is active.
"""

from __future__ import annotations

import importlib
import os
import signal
import threading
from types import ModuleType


def _import_holding_sigint(name: str) -> ModuleType:
    """Import ``name`` with SIGINT held back, then deliver a SIGINT that came meanwhile.

    orjson's module init does not check its own imports of the standard library: a
    ``KeyboardInterrupt`` raised inside them (Ctrl-C right after ``awa-fast worker`` starts)
    made it dereference NULL and the process died of SIGSEGV. Python raises
    ``KeyboardInterrupt`` only in the main thread, so elsewhere this is a plain import.
    """
    if threading.current_thread() is not threading.main_thread():
        return importlib.import_module(name)
    held: list = []
    previous = signal.signal(signal.SIGINT, lambda _signum, frame: held.append(frame))
    try:
        return importlib.import_module(name)
    finally:
        signal.signal(signal.SIGINT, previous)
        if held:
            if callable(previous):
                previous(signal.SIGINT, held[0])  # default_int_handler raises KeyboardInterrupt
            elif previous != signal.SIG_IGN:
                signal.raise_signal(signal.SIGINT)


_import_holding_sigint("orjson")  # before the _ext modules, which import it

try:
    from awa_fast._ext import batch as _batch
    from awa_fast._ext import sizing as _sizing
    from awa_fast._ext import unique as _unique
    from awa_fast._ext import validate as _validate
except ImportError as exc:  # pragma: no cover - only on a broken install
    _here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    _source_tree = os.path.exists(os.path.join(_here, "pyproject.toml"))
    _built = [f for f in os.listdir(os.path.join(_here, "awa_fast", "_ext")) if f.endswith(".so")]
    if _built:  # present but not loadable (another Python's build, a damaged file)
        raise ImportError(
            f"awa_fast's compiled extensions in {_here}/awa_fast/_ext cannot be loaded ({exc}); "
            "rebuild them with `pip install -e .` (or `pip install .`) for this Python"
        ) from exc
    raise ImportError(
        f"awa_fast's compiled extensions are missing in {_here}/awa_fast"
        + (
            # `pip install .` builds them into site-packages; the checkout in the current
            # directory (or on sys.path) shadows that copy
            ": that is a source checkout, which shadows an installed awa-fast; build it in "
            "place with `pip install -e .`, or run from another directory"
            if _source_tree
            else "; install the package with `pip install .` or `pip install -e .` so setup.py "
            "builds _ext/*.pyx"
        )
    ) from exc

validate_insert = _validate.validate_insert
check_name = _validate.check_name
check_json_nul = _validate.check_json_nul
normalize_run_at = _validate.normalize_run_at
derive_kind = _validate.derive_kind
parse_unique_opts = _unique.parse_unique_opts
unique_key = _unique.unique_key
STATE_BITS = _unique.STATE_BITS
request_size = _sizing.request_size
StagingBudget = _sizing.StagingBudget
encode_many = _batch.encode_many
keys_many = _batch.keys_many
copy_block = _batch.copy_block

_MODULES = {"validate": _validate, "unique": _unique, "sizing": _sizing, "batch": _batch}


def native_extensions() -> dict[str, str]:
    """Which implementation backs each hot-path module: ``{"validate": "compiled:<path>", ...}``.

    A module counts as compiled when it was loaded from a shared library (``.so``/``.pyd``).
    """
    out = {}
    for name, mod in _MODULES.items():
        path = getattr(mod, "__file__", "") or ""
        kind = "compiled" if path.endswith((".so", ".pyd")) else "python"
        out[name] = f"{kind}:{path}"
    return out
