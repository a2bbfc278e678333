"""Separate hosts on one machine: a network namespace per service, each with its own address on a private
bridge that the test's own namespace also sits on (so the test can call every service)."""

from __future__ import annotations

import contextlib
import os
import random
import re
import secrets
import shutil
import signal
import subprocess

SUBNET_PREFIX = "10.77"


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


def namespaces_unavailable() -> str | None:
    """Why network namespaces cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return f"network namespaces need root; this test runs as uid {os.geteuid()}"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    probe = f"zbprobe-{secrets.token_hex(3)}"
    made = _ip("netns", "add", probe)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    _ip("netns", "del", probe)
    bridge = f"zbp{secrets.token_hex(3)}"
    made = _ip("link", "add", bridge, "type", "bridge")
    if made.returncode != 0:
        return f"`ip link add ... type bridge` failed: {made.stderr.strip()}"
    _ip("link", "del", bridge)
    return None


def _free_subnet() -> int:
    """A third octet of 10.77.X.0/24 that no interface here uses (runs side by side pick different ones)."""
    used = {int(x) for x in re.findall(rf"{re.escape(SUBNET_PREFIX)}\.(\d+)\.", _ip("-4", "addr").stdout)}
    return random.choice([x for x in range(1, 255) if x not in used])


class NetworkNamespaces:
    """One namespace per name with the address 10.77.X.(i+2)/24 on interface `interfaces[name]`; the bridge
    in this namespace has 10.77.X.1. Names of everything made carry a random tag, so runs never collide."""

    def __init__(self, names: list[str]):
        tag = secrets.token_hex(3)
        subnet = _free_subnet()
        self.bridge = f"zb{tag}br"
        self.host_address = f"{SUBNET_PREFIX}.{subnet}.1"
        self.namespaces = {name: f"zb-{tag}-{name}" for name in names}
        self.addresses = {name: f"{SUBNET_PREFIX}.{subnet}.{i + 2}" for i, name in enumerate(names)}
        self.interfaces = {name: f"zb{tag}n{i}" for i, name in enumerate(names)}
        self._host_ends = {name: f"zb{tag}h{i}" for i, name in enumerate(names)}
        self._made: list[str] = []

    def create(self) -> NetworkNamespaces:
        self._run("link", "add", self.bridge, "type", "bridge")
        self._run("addr", "add", f"{self.host_address}/24", "dev", self.bridge)
        self._run("link", "set", self.bridge, "up")
        for name, netns in self.namespaces.items():
            self._run("netns", "add", netns)
            self._made.append(netns)
            inside, outside = self.interfaces[name], self._host_ends[name]
            self._run("link", "add", outside, "type", "veth", "peer", "name", inside)
            self._run("link", "set", inside, "netns", netns)
            self._run("link", "set", outside, "master", self.bridge)
            self._run("link", "set", outside, "up")
            self._run("-n", netns, "addr", "add", f"{self.addresses[name]}/24", "dev", inside)
            self._run("-n", netns, "link", "set", inside, "up")
            self._run("-n", netns, "link", "set", "lo", "up")
        return self

    def _run(self, *args: str) -> None:
        done = _ip(*args)
        if done.returncode != 0:
            raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")

    def close(self) -> None:
        """Remove the veth pairs, the namespaces and the bridge. Services should be stopped first; anything
        still running in a namespace of this instance (only this test starts processes there) is killed."""
        for netns in self._made:
            for pid in _ip("netns", "pids", netns).stdout.split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
        for outside in self._host_ends.values():
            _ip("link", "del", outside)
        for netns in self._made:
            _ip("netns", "del", netns)
        self._made.clear()
        _ip("link", "del", self.bridge)

    def leftovers(self) -> list[str]:
        """Namespaces or links of this instance still present (empty after close)."""
        names = set(_ip("netns", "list").stdout.split()) | set(re.findall(r"\d+: ([^:@]+)", _ip("link").stdout))
        ours = [*self.namespaces.values(), self.bridge, *self._host_ends.values()]
        return [name for name in ours if name in names]
