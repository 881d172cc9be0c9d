"""The multi-process launcher behind ``awa-fast worker module:client`` (DESIGN.md section 5).

The parent imports nothing of the application. It starts ``processes`` children, each a fresh
interpreter (``python -m awa_fast.supervisor --child ...``, so every connection is opened
after the child exists -- nothing is inherited from a fork). A child:

1. imports ``module`` and looks up ``client`` (an :class:`~awa_fast.client.AsyncClient`, like
   uvicorn's ``module:app``); an optional module-level ``START_OPTIONS`` dict is passed to
   ``client.start()`` as keywords (``poll_interval_ms``, ``heartbeat_staleness_ms``, ...);
2. runs on uvloop (when installed): ``await client.start(queues, **START_OPTIONS)`` -- queues
   from ``--queues name:max_workers,...``, else the client's registered queues;
3. on SIGTERM/SIGINT stops claiming and runs ``client.shutdown(timeout_ms=drain_timeout*1000)``
   (in-flight handlers finish up to the timeout, the rest go back to ``available``, the finalizer
   is flushed), closes the pool and exits 0. A ``def`` handler whose thread still runs then is
   not waited for (the launcher would kill the child): the child logs its job ids and exits 0
   at once, leaving its attempt ``running`` for heartbeat rescue (a thread cannot be stopped,
   nor its attempt given back while it runs).

Each child logs to stderr as ``<time> [child N pid P] LEVEL logger: message`` and reports its
state (ready, maintenance leader, in-flight and finished counts) to the parent over a pipe.

The parent prints one status line per child event on its output, e.g.::

    awa-fast worker: child 0 pid 4242 started
    awa-fast worker: child 0 pid 4242 ready (queues: default:10)
    awa-fast worker: child 0 pid 4242 became maintenance leader
    awa-fast worker: child 1 pid 4243 exited with code -9; restarting in 0.5 s
    awa-fast worker: child 0 pid 4242 status: alive, leader, in-flight 3, completed 120, ...

plus a status line per child every ``status_interval`` seconds. A crashed child is restarted
after a backoff (0.5 s doubling to 10 s, reset once a child has run for 30 s); a child that dies
more than 5 times within 60 s makes the parent drain the others and exit 1. The launcher's
preflight imports the application once, in a running event loop as the children do, checks
``START_OPTIONS`` as ``awa-fast check`` does, and reaches the database (trying for up to
``PREFLIGHT_DATABASE_WAIT_S``, 5 s, while it is not up) and its schema: a bad spec exits 2; an
import that raises, a configuration ``start()`` would reject, a database that cannot be reached
or is not migrated exit 1, each reported in one line (an import's traceback only with
``--traceback`` / ``AWA_FAST_DEBUG=1``), before any child starts. A child that cannot reach the
database all the same (it went away since) within ``CONNECT_TIMEOUT_S`` (10 s) exits
``EXIT_NO_DATABASE`` and is restarted; after 3 such exits with no child ready the parent gives up
(exit 1, "cannot reach the database at host:port"). A child whose import raises anyway exits
``EXIT_IMPORT_FAILED`` and the parent gives up at once (it would fail the same way again). A
child reports such a fatal-at-start error to the parent, which prints it once (the child logs
it only when no parent reads its report). A child whose ``start()`` rejects the configuration (a ``ValidationError`` such as
``ConfigError``) or the schema
(``SchemaNotMigrated``: "run `awa-fast migrate`") exits ``EXIT_BAD_CONFIG`` and the parent gives
up at once with that message. SIGTERM/SIGINT are
forwarded as SIGTERM for a graceful drain (a second signal kills the children); the parent exits
0 when every child drained cleanly. Maintenance runs in exactly one child: the runtime's leader
election (a session advisory lock on ``sql.LEADER_LOCK_KEY``) picks it, and another child takes
over when it dies.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from awa_fast import log_format as log_format_mod
from awa_fast import metrics
from awa_fast.app_loader import (
    DEBUG_ENV,
)
from awa_fast.errors import (
    ConfigError,
)
from awa_fast.launcher_child import (
    CHILD_DATABASE_URL_ENV,
    EXIT_BAD_APP,
    EXIT_BAD_CONFIG,
    EXIT_IMPORT_FAILED,
    EXIT_NO_DATABASE,
    PREFLIGHT_MARK,
    child_entry,
)
from awa_fast.launcher_config import LauncherConfig, parse_queues_arg

if TYPE_CHECKING:
    pass

__all__ = ["LauncherConfig", "Supervisor", "kill_after_s", "parse_queues_arg"]

PREFIX = "awa-fast worker:"
NO_DATABASE_LIMIT = 3  # this many EXIT_NO_DATABASE in a row, no child ready: give up
RESTART_BACKOFF_INITIAL_S = 0.5
RESTART_BACKOFF_MAX_S = 10.0
STABLE_AFTER_S = 30.0
CRASH_LIMIT = 5
CRASH_WINDOW_S = 60.0
# After a child's shutdown: client.close() (psycopg_pool's close waits up to 5 s for its
# workers) and the interpreter's exit.
CHILD_EXIT_S = 10.0


def kill_after_s(drain_timeout_s: float) -> float:
    """Seconds after SIGTERM before the launcher kills a child draining with
    ``drain_timeout_s``: the child's own worst-case shutdown
    (``worker.shutdown.shutdown_bound_s``: the drain, the finalizer's last flush, the presence row, each bounded) plus
    ``CHILD_EXIT_S``, so a child within its bounds is never killed mid-flush."""
    from awa_fast.worker.shutdown import shutdown_bound_s

    return shutdown_bound_s(drain_timeout_s) + CHILD_EXIT_S


# Signals that stop the launcher (a drain); SIGHUP is a closed terminal.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _preflight_result(stdout: str) -> dict | None:
    """The preflight's result in its stdout: the first marked line that parses (the
    application may print anything, a look-alike line too), or None."""
    for line in stdout.splitlines():
        if line.startswith(PREFLIGHT_MARK):
            try:
                found = json.loads(line.removeprefix(PREFLIGHT_MARK))
            except ValueError:
                continue
            if isinstance(found, dict) and isinstance(found.get("explicit_url"), bool):
                return found
    return None


# ---------------------------------------------------------------------------------------------
# the parent


# Children are fresh interpreters (connections are opened in them, never inherited). They put
# this installation of awa_fast first on sys.path, then run the child entry point.
_PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent)
# A worker child records SIGTERM/SIGINT from its first line: a stop that comes while awa_fast or
# the application still imports is a drain of nothing (exit 0), not a death by signal.
# The launcher starts it with both signals blocked (a stop during the interpreter's own startup
# stays pending), and it unblocks them once its handlers are in place.
_CHILD_BOOT = (
    "import signal, sys; early = []\n"
    "if '--child' in sys.argv:\n"
    "    for s in (signal.SIGTERM, signal.SIGINT): signal.signal(s, lambda n, f: early.append(n))\n"
    "signal.pthread_sigmask(signal.SIG_UNBLOCK, (signal.SIGTERM, signal.SIGINT))\n"
    "sys.path.insert(0, sys.argv.pop(1))\n"
    "from awa_fast.launcher_child import child_entry\n"
    "sys.exit(child_entry(sys.argv[1:], early))"
)


@dataclasses.dataclass
class Child:
    """One child slot (index) and its current process."""

    index: int
    proc: subprocess.Popen | None = None
    started_at: float = 0.0
    restart_at: float | None = None
    backoff: float = RESTART_BACKOFF_INITIAL_S
    deaths: collections.deque = dataclasses.field(default_factory=collections.deque)
    status: dict = dataclasses.field(default_factory=dict)
    ready: bool = False
    error: str | None = None  # the last error the child reported
    exit_code: int | None = None
    reader: threading.Thread | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class AppLoadError(Exception):
    """The launcher's preflight could not load the application (reported once, before any
    child starts). ``usage`` is True for a bad ``module:client`` spec (exit status 2), False
    when importing the module raised (exit status 1)."""

    def __init__(self, message: str, *, usage: bool):
        super().__init__(message)
        self.usage = usage


class Supervisor:
    """Starts, watches, restarts and drains worker children.

    Non-blocking building blocks (``start``, ``check``, ``drain``) so that another program (the
    demo) can drive it from its own loop; :meth:`run` is the CLI's blocking loop.

    Args:
        config: what to run and how (:class:`~awa_fast.launcher_config.LauncherConfig`, built
            and validated by :func:`~awa_fast.launcher_config.launcher_config`).
        out: where status lines go (default stdout).
    """

    def __init__(self, config: LauncherConfig, *, out: TextIO | None = None):
        self.config = config
        # resolved by the preflight when neither the launcher nor the client names one
        self.database_url = config.database_url
        self.out = out
        self._json = (
            log_format_mod.formatter("json", static={"pid": os.getpid()})
            if config.log_format == "json"
            else None
        )
        self.children = [Child(i) for i in range(config.processes)]
        self.failed: str | None = None  # why the supervisor gave up
        self._no_database = 0  # EXIT_NO_DATABASE exits since a child was last ready
        self._print_lock = threading.Lock()
        self._next_status = 0.0
        self.metrics_exporter: metrics.LauncherExporter | None = None

    # -- output ---------------------------------------------------------------------------------

    def say(self, message: str, *, error: bool = False, warning: bool = False) -> None:
        """One status line on ``out`` (an error or a warning on stderr): ``awa-fast worker:
        ...``, or a JSON log object of logger ``awa_fast.launcher`` with ``log_format="json"``."""
        out = sys.stderr if error or warning else (self.out or sys.stdout)
        level = logging.ERROR if error else logging.WARNING if warning else logging.INFO
        if self._json is not None:
            text = log_format_mod.line(self._json, "awa_fast.launcher", message, level)
        else:
            tag = "error: " if error else "warning: " if warning else ""
            text = f"{PREFIX} {tag}{message}"
        with self._print_lock:
            try:
                print(text, file=out, flush=True)
            except (OSError, ValueError):
                pass

    def _describe(self, c: Child) -> str:
        return f"child {c.index} pid {c.pid}"

    def status_line(self, c: Child) -> str:
        if not c.alive:
            if c.restart_at is not None:
                return f"child {c.index}: restarting in {max(c.restart_at - time.monotonic(), 0):.1f} s"
            return f"child {c.index}: exited ({c.exit_code})"
        s = c.status
        parts = ["alive" if c.ready else "starting"]
        if s.get("leader"):
            parts.append("leader")
        parts.append(f"in-flight {s.get('in_flight', 0)}")
        for name, n in sorted((s.get("outcomes") or {}).items()):
            parts.append(f"{name} {n}")
        return f"{self._describe(c)} status: " + ", ".join(parts)

    # -- preflight ------------------------------------------------------------------------------

    def preflight(self) -> None:
        """Import the application once, in a child interpreter like the workers', before any
        worker starts; then, when neither ``database_url`` nor the client names a database,
        resolve it here once (:func:`~awa_fast.database_url.resolve_database_url`, which may
        start the embedded server) and hand it to every child.

        Raises:
            AppLoadError: the spec names no module or no AsyncClient (``usage``), importing it
                failed, or ``start()`` would reject its ``START_OPTIONS`` / ``queues``.
            EmbeddedPostgresError: no URL is configured and the embedded server cannot start.
        """
        argv = [
            sys.executable,
            "-c",
            _CHILD_BOOT,
            _PACKAGE_ROOT,
            "--check",
            "--app",
            self.config.app,
        ]
        if self.config.queues:
            argv += ["--queues", self.config.queues]
        env = self._env()
        if self.config.metrics_port is not None:  # as the children will: metrics_refresh_ms applies
            env[metrics.LAUNCHER_ENV] = "refresh"
        if self.database_url:  # the preflight reaches the database the children will use
            env[CHILD_DATABASE_URL_ENV] = self.database_url
        r = subprocess.run(
            argv,
            env=env,
            capture_output=True,
            text=True,
            errors="replace",  # what the application prints need not be UTF-8
            stdin=subprocess.DEVNULL,
        )
        if r.returncode == EXIT_BAD_APP:
            raise AppLoadError(r.stderr.strip(), usage=True)
        if r.returncode == EXIT_BAD_CONFIG:
            raise AppLoadError(f"{self.config.app}: {r.stderr.strip()}", usage=False)
        if r.returncode == EXIT_NO_DATABASE:
            raise AppLoadError(f"{r.stderr.strip()}; no worker process started", usage=False)
        if r.returncode != 0:  # its one line (and the traceback with --traceback)
            raise AppLoadError(
                r.stderr.strip() or f"importing {self.config.app} failed", usage=False
            )
        result = _preflight_result(r.stdout)
        if result is None:
            raise AppLoadError(
                f"importing {self.config.app} ended its program (the preflight did not finish); "
                "does the module exit at import?",
                usage=False,
            )
        for warning in result.get("warnings") or ():  # start()'s, once (not per child)
            self.say(str(warning), warning=True)
        if not self.database_url and not result["explicit_url"]:
            from awa_fast.database_url import resolve_database_url

            self.database_url = resolve_database_url(None)

    # -- children -------------------------------------------------------------------------------

    def _env(self, index: int | None = None) -> dict:
        # The application's modules resolve from the launcher's directory; awa_fast itself is
        # pinned to this installation by _CHILD_BOOT (a source checkout in the current
        # directory must not shadow an installed, compiled awa_fast).
        env = dict(os.environ)
        cwd = os.getcwd()
        path = env.get("PYTHONPATH")
        env["PYTHONPATH"] = cwd + (os.pathsep + path if path else "")
        env.update(self.config.extra_env)
        if self.config.debug:
            env[DEBUG_ENV] = "1"
        env.pop(metrics.LAUNCHER_ENV, None)  # only this launcher's own exporter sets it
        env.pop(CHILD_DATABASE_URL_ENV, None)
        if index is not None and self.database_url:
            env[CHILD_DATABASE_URL_ENV] = self.database_url
        if self.metrics_exporter is not None:
            env.update(self.metrics_exporter.children_env(refresh=index == 0))
        return env

    def _spawn(self, c: Child) -> None:
        rfd, wfd = os.pipe()
        argv = [
            sys.executable,
            "-c",
            _CHILD_BOOT,
            _PACKAGE_ROOT,
            "--child",
            "--app",
            self.config.app,
            "--index",
            str(c.index),
            "--drain-timeout",
            str(self.config.drain_timeout_s),
            "--status-fd",
            str(wfd),
            "--log-level",
            self.config.log_level,
            "--log-format",
            self.config.log_format,
        ]
        if self.config.queues:
            argv += ["--queues", self.config.queues]
        try:
            # Own process group: a terminal's Ctrl-C reaches the parent only, which forwards it.
            # Started with SIGTERM/SIGINT blocked (the mask is inherited): _CHILD_BOOT unblocks.
            blocked = signal.pthread_sigmask(signal.SIG_BLOCK, (signal.SIGTERM, signal.SIGINT))
            try:
                c.proc = subprocess.Popen(
                    argv, env=self._env(c.index), pass_fds=(wfd,), process_group=0
                )
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        finally:
            os.close(wfd)
        c.started_at = time.monotonic()
        c.restart_at = None
        c.ready = False
        c.error = None
        c.status = {}
        c.exit_code = None
        c.reader = threading.Thread(
            target=self._read_status,
            args=(c, c.proc, rfd),
            name=f"awa-fast-child-{c.index}",
            daemon=True,
        )
        c.reader.start()
        self.say(f"{self._describe(c)} started")

    def _read_status(self, c: Child, proc: subprocess.Popen, rfd: int) -> None:
        with os.fdopen(rfd, "r") as f:
            for line in f:
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                if c.proc is not proc:
                    continue
                event = msg.pop("event", None)
                who = f"child {c.index} pid {proc.pid}"
                if event == "ready":
                    c.ready = True
                    self._no_database = 0
                    self.say(f"{who} ready (queues: {msg.get('queues')})")
                elif event == "status":
                    was = bool(c.status.get("leader"))
                    c.status = msg
                    if msg.get("leader") and not was:
                        self.say(f"{who} became maintenance leader")
                elif event == "draining":
                    self.say(f"{who} draining")
                elif event == "error":  # printed with the child's exit, once
                    c.error = msg.get("error")

    def start(self) -> None:
        """Start every child (and the metrics endpoint first, when ``metrics_port`` is set).

        Raises:
            ConfigError: the metrics port cannot be bound.
        """
        if self.config.metrics_port is not None and self.metrics_exporter is None:
            self.metrics_exporter = metrics.LauncherExporter(
                self.config.metrics_port, self.config.metrics_host
            )
            self.say(
                f"metrics of all children at {self.metrics_exporter.url} "
                f"(directory {self.metrics_exporter.directory})"
            )
        for c in self.children:
            self._spawn(c)
        self._next_status = time.monotonic() + self.config.status_interval_s

    def check(self) -> bool:
        """Reap dead children, schedule and perform restarts, print periodic status.

        Returns False once the supervisor gave up (``self.failed`` says why)."""
        now = time.monotonic()
        for c in self.children:
            if c.proc is not None and c.restart_at is None and c.proc.poll() is not None:
                code = c.proc.returncode
                c.exit_code = code
                self._metrics_child_exited(c)
                if (
                    code in (EXIT_BAD_APP, EXIT_BAD_CONFIG, EXIT_NO_DATABASE, EXIT_IMPORT_FAILED)
                    and c.reader is not None
                ):
                    c.reader.join(timeout=1.0)  # its last words (the error event) first
                if code == EXIT_BAD_APP:
                    why = f": {c.error}" if c.error else ""
                    self.failed = (
                        f"{self._describe(c)} cannot load {self.config.app}{why}; giving up"
                    )
                    self.say(f"{self._describe(c)} exited with code {code}")
                    return False
                if code == EXIT_IMPORT_FAILED:
                    why = c.error or f"importing {self.config.app} failed"
                    self.failed = f"{self._describe(c)}: {why}; giving up"
                    self.say(f"{self._describe(c)} exited with code {code}")
                    return False
                if code == EXIT_BAD_CONFIG:
                    self.failed = (
                        f"{self._describe(c)} cannot start {self.config.app}: "
                        f"{c.error or 'configuration rejected'}; giving up"
                    )
                    self.say(f"{self._describe(c)} exited with code {code}")
                    return False
                if code == EXIT_NO_DATABASE:
                    self._no_database += 1
                    if self._no_database >= NO_DATABASE_LIMIT and not any(
                        x.ready for x in self.children
                    ):
                        self.say(f"{self._describe(c)} exited with code {code}")
                        self.failed = (
                            f"{c.error or 'the database cannot be reached'} "
                            f"({self._no_database} attempts); giving up"
                        )
                        return False
                if now - c.started_at >= STABLE_AFTER_S:
                    c.backoff = RESTART_BACKOFF_INITIAL_S
                c.deaths.append(now)
                while c.deaths and now - c.deaths[0] > CRASH_WINDOW_S:
                    c.deaths.popleft()
                if len(c.deaths) > CRASH_LIMIT:
                    self.say(f"{self._describe(c)} exited with code {code}")
                    self.failed = (
                        f"child {c.index} died {len(c.deaths)} times within "
                        f"{CRASH_WINDOW_S:g} s; giving up"
                    )
                    return False
                c.restart_at = now + c.backoff
                why = f" ({c.error})" if c.error else ""  # what it reported before exiting
                self.say(
                    f"{self._describe(c)} exited with code {code}{why}; restarting in "
                    f"{c.backoff:g} s"
                )
                c.backoff = min(c.backoff * 2, RESTART_BACKOFF_MAX_S)
            elif c.restart_at is not None and now >= c.restart_at:
                self._spawn(c)
        if self.config.status_interval_s and now >= self._next_status:
            for c in self.children:
                self.say(self.status_line(c))
            self._next_status = now + self.config.status_interval_s
        return True

    def signal_all(self, sig: int) -> None:
        for c in self.children:
            if c.proc is not None and c.alive:
                try:
                    c.proc.send_signal(sig)
                except ProcessLookupError:
                    pass

    def drain(
        self, timeout: float | None = None, *, interrupted: Callable[[], bool] = lambda: False
    ) -> bool:
        """SIGTERM every child and wait for them (up to :func:`kill_after_s` of the drain
        timeout: the child's own worst-case shutdown and exit, then SIGKILL). Pending restarts are dropped. Returns True when every
        running child exited 0."""
        for c in self.children:
            c.restart_at = None
        running = [c for c in self.children if c.alive]
        if running:
            self.say(
                f"draining {len(running)} child(ren) (timeout {self.config.drain_timeout_s:g} s)"
            )
        self.signal_all(signal.SIGTERM)
        deadline = time.monotonic() + kill_after_s(
            self.config.drain_timeout_s if timeout is None else timeout
        )
        clean = True
        for c in running:
            proc = c.proc
            assert proc is not None  # running children have a process
            while proc.poll() is None:
                if time.monotonic() >= deadline or interrupted():
                    self.say(f"{self._describe(c)} did not stop in time; killing it")
                    proc.kill()
                    proc.wait()
                    break
                time.sleep(0.05)
            c.exit_code = proc.returncode
            self._metrics_child_exited(c)
            if c.exit_code != 0:
                clean = False
            self.say(f"{self._describe(c)} exited with code {c.exit_code}")
        for c in running:
            if c.reader is not None:
                c.reader.join(timeout=1.0)
        return clean

    def _metrics_child_exited(self, c: Child) -> None:
        if self.metrics_exporter is not None and c.proc is not None:
            self.metrics_exporter.child_exited(c.proc.pid)

    def close(self) -> None:
        """Stop the metrics endpoint and remove its directory (after :meth:`drain`)."""
        if self.metrics_exporter is not None:
            self.metrics_exporter.close()
            self.metrics_exporter = None

    def kill_all(self) -> None:
        self.signal_all(signal.SIGKILL)

    def run(self) -> int:
        """The CLI loop: :meth:`preflight`, start, supervise until SIGTERM/SIGINT (drain; a
        second signal kills) or a crash loop. Returns the exit status: 0 after a clean drain, 2
        when the spec names no module or no AsyncClient (reported once, no child started), 1
        otherwise (an import that raises, a configuration start() would reject, a crash loop)."""
        signals: list[int] = []

        def on_signal(signum, _frame):
            # Nothing that takes a lock here (say() does): the handler may run while this
            # thread holds it. The drain reports the kill once the children are gone.
            signals.append(signum)
            if len(signals) > 1:
                self.kill_all()

        try:
            self.preflight()
        except AppLoadError as exc:
            self.say(str(exc), error=True)
            return 2 if exc.usage else 1
        previous = {s: signal.signal(s, on_signal) for s in STOP_SIGNALS}
        try:
            self.say(
                f"starting {self.config.processes} worker process(es) for {self.config.app} (pid {os.getpid()})"
            )
            try:
                self.start()
            except ConfigError as exc:
                self.say(str(exc), error=True)
                return 2
            ok = True
            while not signals:
                if not self.check():
                    ok = False
                    break
                time.sleep(0.05)
            if not ok:
                self.say(self.failed or "giving up")
                self.drain()
                return 1
            name = signal.Signals(signals[0]).name
            self.say(f"received {name}; stopping")
            clean = self.drain(interrupted=lambda: len(signals) > 1)
            if len(signals) > 1:
                killed = [c for c in self.children if c.exit_code == -signal.SIGKILL]
                self.say(
                    f"second signal: {len(killed)} child(ren) killed (SIGKILL); the attempts "
                    "they were running stay 'running' until heartbeat rescue takes them (after "
                    "heartbeat_staleness_ms, 90 s by default)"
                    if killed
                    else "second signal: every child had already stopped; nothing was killed"
                )
            self.say("all children stopped" if clean else "children stopped with errors")
            return 0 if clean else 1
        finally:
            self.close()
            for s, h in previous.items():
                signal.signal(s, h)


if __name__ == "__main__":
    if "--child" in sys.argv[1:]:
        sys.exit(child_entry(sys.argv[1:]))
    sys.exit("usage: awa-fast worker module:client [options]")
