"""The ``awa-fast`` command line (also ``python -m awa_fast``), modelled on awa-pg's ``python -m awa``.

Every invocation runs at most one event loop (uvloop when available) and one
:class:`~awa_fast.client.AsyncClient`, closed before exit.

Exit status: 0 on success, 1 on an error (an ``AwaError``, a database or connection error, a job
that does not exist or is in the wrong state; for ``serve`` also a database that accepted no
connection within 30 s of its startup), 2 on a command-line usage error (argparse), 3 when
``serve``'s web server cannot start (the port taken), 130 on Ctrl-C (``worker`` and ``serve``
stop gracefully on Ctrl-C or SIGTERM and exit 0; 143 / 129 when SIGTERM / SIGHUP interrupts
``demo``; 142 when a stop of ``serve`` outlasts ``STOP_LIMIT_S``). With
``--json`` an error is one JSON object on one line of stderr, ``{"error": <message>, "type":
<error class>}``, with the same exit status. Without it an error is one line (``awa-fast: error:
<message>``); ``--traceback`` or ``AWA_FAST_DEBUG=1`` adds its whole traceback (for ``worker`` and
``check`` also of an application's own error at import).

The commands are declared in a table (:mod:`awa_fast.cli.table`: one :class:`Command` per
command, with its arguments, help and handler, grouped by area in this package's modules:
``jobs``, ``queues``, ``dlq``, ``cron``, ``storage``, ``batch_ops``, ``embedded``, ``migrate``,
``consequences``, ``worker``, ``serve``, ``demo``, ``bench``); :mod:`awa_fast.cli.parser` lists
them in ``--help``'s order and builds the argparse parser from them; :mod:`awa_fast.cli.entry`
runs one.
"""

from __future__ import annotations

from awa_fast.cli.entry import main
from awa_fast.cli.output import format_table
from awa_fast.cli.parser import build_parser

__all__ = ["build_parser", "format_table", "main"]
