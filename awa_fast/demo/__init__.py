"""The built-in demo behind ``awa-fast demo``: an import-graph pipeline over the standard library
of the Python that runs it, worked by the multi-process launcher.

Stage A (``demo_parse_imports``, args :class:`ParseImports`), one job per ``.py`` file under
``sysconfig.get_paths()["stdlib"]`` (``site-packages`` skipped, test directories included):
read the file, ``ast.parse`` it and collect the top-level names of its absolute imports
(``import a.b`` and ``from a.b import c`` give ``a``; relative imports are skipped). For each
distinct name it stages a stage-B job with ``job.enqueue_on_completion(ResolveModule(name),
unique_opts={})`` (ADR-046): the B rows are inserted in the same transaction that completes A,
and the default unique options (kind + args, states including ``completed``) make every distinct
module get exactly one B however many files import it; the other requests are skipped as
duplicates. A file that cannot be read or parsed (the test suite holds deliberately broken ones)
fails its A job with a ``TerminalError`` naming the file and the error; it is counted, not fatal.

ADR-046 allows at most 16 staged follow-ups per attempt. A file importing more than 16 distinct
modules stages the first 15 (in sorted order) plus one continuation A job,
``ParseImports(path, offset=15)``, which re-parses the file and stages the next chunk, and so
on. Names are staged in sorted order everywhere so that concurrent completions take their unique
claims in one global order (ADR-046's multi-insert deadlock note).

Stage B (``demo_resolve_module``, args :class:`ResolveModule`, priority 1 so that Bs run as
soon as they appear, alongside the remaining As): ``importlib.util.find_spec`` on
the top-level name (no module code runs) against the worker's ``sys.path``; the result (found,
origin, file size) is upserted into the table ``awa_fast_demo_modules`` (created by the demo).

The demo parent: migrate; delete the rows of a previous run (both kinds, DLQ included; empty the
result table); enqueue every A job with one COPY (``insert_many_copy``); start ``processes``
worker children with :class:`~awa_fast.supervisor.Supervisor` (this module's ``client``,
queue ``demo``); print a progress line to stderr every second; when every A and B job is
terminal, drain the children and print the report. The check re-parses the files directly
(a plain process pool, no queue): the B rows must be exactly the distinct set of top-level modules imported by the
successfully parsed files (and the failed A jobs exactly the files that do not parse), else
``check: MISMATCH`` and exit status 1. "Skipped as duplicates" is the number of staged requests
(the sum over parsed files of their distinct-module counts) minus the B rows.

Interrupted (Ctrl-C, SIGTERM from a service manager, or the SIGHUP of a closed terminal) while
its jobs run, the parent
drains the children, counts the demo's jobs by kind and state (continuations counted apart),
deletes the unfinished ones (continuations and B jobs included), prints a summary and exits
128 + the signal's number, as a shell reports a process the signal ended: 130 after Ctrl-C,
143 after SIGTERM, 129 after SIGHUP. Interrupted while it migrates the schema, it first waits
for the migration under way to end (each migration is one transaction: it commits or rolls back
whole); interrupted before it began to enqueue its jobs, its summary says nothing was enqueued
(nothing is counted or removed). A second signal, or one after every demo job finished, ends
the process at once (Ctrl-C: 130; SIGTERM, SIGHUP: the default action), with one exception:
during the check (after ``pipeline done``), SIGTERM or SIGHUP (as Ctrl-C) first cancels the
check and terminates its pool's processes, then the demo exits 128 + the signal's number
without a report (none of its processes outlives it). Past ``--timeout`` seconds (default 600)
it stops the same way (drain, count, delete the unfinished jobs, summary ``timed out after
...``) and exits 1.
"""

# The names the CLI, the tests and the worker children ("awa_fast.demo:client") use.
from awa_fast.demo.pipeline import MAX_STAGED, chunk, client, imported_modules
from awa_fast.demo.report import embedded_notice
from awa_fast.demo.run import run_demo

__all__ = ["MAX_STAGED", "chunk", "client", "embedded_notice", "imported_modules", "run_demo"]
