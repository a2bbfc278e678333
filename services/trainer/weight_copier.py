"""The copier, one part of the weight sync (services/common/sync_protocol.py): published weights are copied into
the spare of two sets of send buffers on a thread of their own, while the caller goes on (the trainer: into its
next step's forward and backward). The caller waits for the copy (`wait_copied`) only before it changes the
weights (the trainer: before its optimizer steps). The sender takes the newest copy (`newest`) when it starts a
broadcast, swapping the sets, so the set being sent is never written and a publish never waits for a broadcast.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from zerobubble.common.sync_protocol import Copier, Machine
from zerobubble.common.weight_sync import Manifest


@dataclass
class Snapshot:
    manifest: Manifest
    buffers: list[torch.Tensor]
    version: int = -1


class WeightCopier:
    def __init__(self, bucket_bytes: int, device: str, on_copied: Callable[[int, float], None]):
        """`on_copied(version, seconds)` is called once a version is in the spare buffers."""
        self._bucket_bytes = bucket_bytes
        self._device = device
        self._on_copied = on_copied
        self.state = Machine(Copier.WAITING)
        self._cond = threading.Condition()
        self._job: tuple[list[tuple[str, torch.Tensor]], int] | None = None
        self._closed = False
        self._copied = threading.Event()
        self._copied.set()
        self._error: BaseException | None = None
        self._swap_lock = threading.Lock()
        self._spare: Snapshot | None = None
        self._thread = threading.Thread(target=self._run, name="weight-copy", daemon=True)

    def start(self) -> WeightCopier:
        self._thread.start()
        return self

    def publish(self, named: list[tuple[str, torch.Tensor]], version: int) -> None:
        self.wait_copied()  # one copy at a time, in order
        with self._cond:
            self._copied.clear()
            self._job = (named, version)
            self._cond.notify_all()

    def wait_copied(self) -> None:
        """Wait until the last publish's weights are copied (from then on they may change); raises what failed
        the copy."""
        self._copied.wait()
        error, self._error = self._error, None
        if error is not None:
            raise error

    def newest(self, sending: Snapshot | None) -> Snapshot:
        """What the sender sends next: the spare set when it holds a newer version (the sets swap), else the set it
        sent last, again (a member joined)."""
        with self._swap_lock:
            if sending is None or (self._spare is not None and self._spare.version > sending.version):
                self._spare, sending = sending, self._spare
            return sending

    def close(self, timeout: float) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout=timeout)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._job is not None or self._closed)
                if self._closed:
                    self._copied.set()
                    return
                (named, version), self._job = self._job, None
            self.state.to(Copier.COPYING)
            try:
                self._copy(named, version)
            except BaseException as exc:
                self._error = exc
            finally:
                self.state.to(Copier.WAITING)
                self._copied.set()

    def _copy(self, named: list[tuple[str, torch.Tensor]], version: int) -> None:
        started = time.perf_counter()
        manifest = Manifest.plan(named, self._bucket_bytes)
        with self._swap_lock:
            spare = self._spare
            if spare is None or spare.manifest != manifest:
                spare = Snapshot(manifest, manifest.allocate(self._device))
            manifest.pack(named, spare.buffers)
            if spare.buffers and spare.buffers[0].is_cuda:
                torch.cuda.current_stream(spare.buffers[0].device).synchronize()
            spare.version = version
            self._spare = spare
        self._on_copied(version, time.perf_counter() - started)
