"""A real ``awa-fast serve`` process and Debian's chromium, for the browser tests and the
screenshot script (never ``playwright install``: the system browser is the one CI installs)."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
_LISTENING = re.compile(r"Uvicorn running on (http://\S+)")


@contextlib.contextmanager
def served(dsn: str, *args: str, timeout: float = 60.0) -> Iterator[str]:
    """Run ``awa-fast serve --port 0 [args]`` on ``dsn``; yields its base URL (read from
    uvicorn's start line, so no port race and no sleep), stops it afterwards."""
    env = {**os.environ, "AWA_FAST_DATABASE_URL": dsn}
    env.pop("AWA_FAST_SERVE_TOKEN", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "awa_fast", "serve", "--port", "0", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    found = threading.Event()
    url: list[str] = []
    lines: list[str] = []

    def read() -> None:
        for line in proc.stderr:  # type: ignore[union-attr]
            lines.append(line)
            m = _LISTENING.search(line)
            if m and not url:
                url.append(m.group(1).rstrip("/"))
                found.set()
        found.set()  # the process ended

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        if not found.wait(timeout) or not url:
            raise AssertionError("awa-fast serve did not start:\n" + "".join(lines))
        yield url[0]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        reader.join(timeout=5)
