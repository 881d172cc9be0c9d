"""Worker "hosts" on this machine: Linux network namespaces, each joined to the root namespace by
a veth pair of its own on a private /30 (``10.200.X.0/30``: ``.1`` on the root side, where
PostgreSQL and PgBouncer listen; ``.2`` in the namespace). Used by tests/deploy/test_hosts.py and the
bench's ``hosts`` scenario. Needs root and ``ip`` (iproute2); a missing ``ip`` raises
:class:`NetnsError`.

Nothing leaves the machine: a namespace has no route but its /30, and every /30 also gets a
``blackhole`` route in the root namespace (behind the link's own route), so while a link is down
(:meth:`Hosts.cut`) the root namespace's packets to that host are dropped, not sent to the
default gateway.

Names carry the creating process's pid (namespace ``awa<pid>-<i>``, root-side link
``aw<pid>r<i>``); subnets are allocated under a file lock among those not in use, so parallel
test workers and concurrent sessions never collide. Namespaces of dead processes (a run that was
killed) are removed at the next allocation.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import re
import shutil
import subprocess
from collections.abc import Iterator, Sequence

from awa_fast.embedded.cluster import _pid_alive

IP = shutil.which("ip", path=os.environ.get("PATH", "") + ":/usr/sbin:/sbin")
PREFIX = "10.200"  # the private /16 the /30s are taken from
LOCK = "/tmp/awa-fast-netns.lock"
BLACKHOLE_METRIC = "32000"  # behind the link's own route (metric 0)
_NAME = re.compile(r"^awa(\d+)-(\d+)$")


class NetnsError(RuntimeError):
    """``ip`` is missing, this process is not root, or an ``ip`` command failed."""


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``ip args...``.

    Raises:
        NetnsError: ``ip`` is not installed, or (``check``) the command failed.
    """
    if IP is None:
        raise NetnsError("ip (iproute2) is not installed: apt-get install -y iproute2")
    r = subprocess.run([IP, *args], capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {r.stderr.strip()}")
    return r


@dataclasses.dataclass(frozen=True)
class Host:
    """One namespace: its name, its link's root-side interface, the root side's address
    (``server_ip``, where servers listen for this host) and the host's own (``ip``)."""

    index: int
    netns: str
    link: str
    server_ip: str
    ip: str
    subnet: str

    def argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside this namespace (``ip netns exec``; the environment is kept)."""
        assert IP is not None
        return [IP, "netns", "exec", self.netns, *argv]


def _used_subnets() -> set[int]:
    """The third octets of every 10.200.X address or blackhole route in the root namespace."""
    used = set()
    pattern = re.compile(re.escape(PREFIX) + r"\.(\d+)\.")
    for line in ip("-o", "-4", "addr", "show").stdout.splitlines():
        used.update(int(m) for m in pattern.findall(line))
    for line in ip("route", "show", "type", "blackhole").stdout.splitlines():
        used.update(int(m) for m in pattern.findall(line))
    return used


def _remove_stale() -> None:
    """Namespaces (and their blackhole routes) left by processes that are gone."""
    for line in ip("netns", "list").stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        m = _NAME.match(name)
        if m and not _pid_alive(int(m.group(1))):
            ip("netns", "delete", name, check=False)
    live = set()
    pattern = re.compile(re.escape(PREFIX) + r"\.(\d+)\.")
    for line in ip("-o", "-4", "addr", "show").stdout.splitlines():
        live.update(int(x) for x in pattern.findall(line))
    for line in ip("route", "show", "type", "blackhole").stdout.splitlines():
        m = re.search(re.escape(PREFIX) + r"\.(\d+)\.0/30", line)
        if m and int(m.group(1)) not in live:
            ip("route", "del", *line.split(), check=False)


class Hosts:
    """``count`` namespaces with their links up; :meth:`close` (or the context manager)
    removes them all, whatever happened.

    Raises:
        NetnsError: no ``ip``, not root, no free /30 left, or a setup command failed (what was
            created is removed first).
    """

    def __init__(self, count: int) -> None:
        if IP is None:
            raise NetnsError("ip (iproute2) is not installed: apt-get install -y iproute2")
        if os.geteuid() != 0:
            raise NetnsError("network namespaces need root")
        self.hosts: list[Host] = []
        self._routes: list[str] = []
        try:
            with open(LOCK, "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                _remove_stale()
                used = _used_subnets()
                free = (x for x in range(256) if x not in used)
                for i in range(count):
                    x = next(free, None)
                    if x is None:
                        raise NetnsError(f"no free /30 left in {PREFIX}.0.0/16")
                    self._create(i, x)
        except BaseException:
            self.close()
            raise

    def _create(self, i: int, x: int) -> Host:
        pid = os.getpid()
        net = f"{PREFIX}.{x}"
        host = Host(i, f"awa{pid}-{i}", f"aw{pid}r{i}", f"{net}.1", f"{net}.2", f"{net}.0/30")
        inner = f"aw{pid}n{i}"
        ip("netns", "add", host.netns)
        self.hosts.append(host)  # removed by close() from here on
        ip("route", "add", "blackhole", host.subnet, "metric", BLACKHOLE_METRIC)
        self._routes.append(host.subnet)
        ip("link", "add", host.link, "type", "veth", "peer", "name", inner, "netns", host.netns)
        ip("addr", "add", f"{host.server_ip}/30", "dev", host.link)
        ip("link", "set", host.link, "up")
        ip("-n", host.netns, "addr", "add", f"{host.ip}/30", "dev", inner)
        ip("-n", host.netns, "link", "set", inner, "up")
        ip("-n", host.netns, "link", "set", "lo", "up")
        return host

    def __iter__(self) -> Iterator[Host]:
        return iter(self.hosts)

    def __len__(self) -> int:
        return len(self.hosts)

    def __getitem__(self, i: int) -> Host:
        return self.hosts[i]

    @property
    def server_ips(self) -> list[str]:
        return [h.server_ip for h in self.hosts]

    def cut(self, host: Host) -> None:
        """Take ``host``'s link down (``ip link set <veth> down``): its connections hang, as
        behind a pulled cable, until :meth:`restore`."""
        ip("link", "set", host.link, "down")

    def restore(self, host: Host) -> None:
        ip("link", "set", host.link, "up")

    def host_of(self, pid: int) -> Host | None:
        """The host whose namespace process ``pid`` runs in (None: another namespace, or gone)."""
        try:
            inode = os.stat(f"/proc/{pid}/ns/net").st_ino
        except OSError:
            return None
        for host in self.hosts:
            with contextlib.suppress(OSError):
                if os.stat(f"/run/netns/{host.netns}").st_ino == inode:
                    return host
        return None

    def close(self) -> None:
        """Remove every namespace (its link goes with it) and blackhole route; idempotent."""
        hosts, self.hosts = self.hosts, []
        routes, self._routes = self._routes, []
        for host in hosts:
            ip("netns", "delete", host.netns, check=False)
        for subnet in routes:
            ip("route", "del", "blackhole", subnet, "metric", BLACKHOLE_METRIC, check=False)

    def __enter__(self) -> Hosts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
