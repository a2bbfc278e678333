"""`zerobubble view` as a real process on a free port, HTTP requests to it sent as bytes (so paths reach the server
exactly as written, `..` included), and Debian's chromium driven headless against it."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

REPO = Path(__file__).resolve().parents[3]
CHROMIUM = shutil.which("chromium")
NEEDS_CHROMIUM = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (`make browser-tool` "
                                    "installs it as root): the viewer's browser tests skip")


@contextlib.contextmanager
def viewer(run_dir: Path, *options: str) -> Iterator[str]:
    """The viewer of `run_dir` (with `zerobubble view`'s `options`) for the block; its base URL, without the
    trailing slash."""
    process = subprocess.Popen([sys.executable, "-m", "zerobubble", "view", str(run_dir), "--port", "0", *options],
                               cwd=REPO,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        line = process.stdout.readline()
        assert line, f"zerobubble view exited with {process.wait(10)}: {process.stderr.read()}"
        yield json.loads(line)["url"].rstrip("/")
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def viewer_pid(run_dir: Path) -> int:
    """The `zerobubble view` process of `run_dir`, found in /proc by its command line."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"view" in argv and str(run_dir).encode() in argv:
                return int(entry.name)
    raise AssertionError(f"no zerobubble view process of {run_dir}")


def raw_get(base: str, target: str, method: str = "GET", host: str | None = None) -> tuple[int, bytes]:
    """One request with `target` sent byte for byte as the request line's path (and `host` as its Host); the
    status and the body."""
    parts = urlsplit(base)
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
        sock.sendall(f"{method} {target} HTTP/1.1\r\nHost: {host or parts.netloc}\r\nConnection: close\r\n\r\n"
                     .encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    if b"transfer-encoding: chunked" in head.lower():
        body = _unchunk(body)
    return int(head.split(b" ", 2)[1]), body


def _unchunk(body: bytes) -> bytes:
    out = b""
    while body:
        size_line, _, rest = body.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            break
        out += rest[:size]
        body = rest[size + 2:]
    return out


def get_json(base: str, target: str, host: str | None = None) -> tuple[int, dict]:
    status, body = raw_get(base, target, host=host)
    return status, json.loads(body)


def chromium(url: str, *, screenshot: Path | None = None, height: int = 1000,
             net_log: Path | None = None) -> tuple[str, list[str]]:
    """`url` in headless chromium until the page's requests have settled: the DOM as it then stands, and every
    console message the page printed (the viewer prints none, so each is an error, a refused request or a
    content-security violation). `net_log`: where chromium writes every request it made (see page_requests)."""
    output = ["--screenshot=" + str(screenshot)] if screenshot else ["--dump-dom"]
    output += [f"--log-net-log={net_log}"] if net_log else []
    done = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                           "--enable-logging=stderr", "--v=0", "--virtual-time-budget=8000",
                           f"--window-size=1280,{height}", *output, url],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    console = [line for line in done.stderr.splitlines() if ":CONSOLE" in line]
    return done.stdout, console


def page_requests(net_log: Path) -> set[tuple[str, str]]:
    """(initiator, URL) of every request a page made, from chromium's net log (the browser's own requests, such as
    its update checks, have no page as initiator and are left out)."""
    events = json.loads(net_log.read_text())["events"]
    return {(params["initiator"], params["url"]) for event in events if (params := event.get("params"))
            and "url" in params and params.get("initiator", "not an origin") != "not an origin"}
