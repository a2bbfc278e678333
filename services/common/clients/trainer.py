"""Typed client of the trainer service, for rollout workers and tools."""

from __future__ import annotations

from typing import Any

from zerobubble.common.client import ServiceClient
from zerobubble.v1 import trainer_pb2, trainer_pb2_grpc


class TrainerClient(ServiceClient):
    stub_class = trainer_pb2_grpc.TrainerServiceStub

    def join(self, worker_id: str, device: str = "cpu", *, timeout: float | None = None,
             retry: bool = True) -> trainer_pb2.JoinReply:
        """Become a member of the weight-broadcast group from the next publish on."""
        return self.unary("JoinWeightSync", trainer_pb2.JoinRequest(worker_id=worker_id, device=device),
                          timeout=timeout, retry=retry)

    def watch(self, worker_id: str) -> Any:
        """The member's announcements as a stream (iterate it; `cancel()` ends it). It has no deadline: it
        lasts as long as the membership, and ends when the trainer drops the member or goes away."""
        return self.stub.WatchWeights(trainer_pb2.WatchRequest(worker_id=worker_id), metadata=self.metadata)

    def status(self, *, timeout: float | None = None) -> trainer_pb2.TrainerStatusReply:
        return self.unary("Status", trainer_pb2.TrainerStatusRequest(), timeout=timeout)

    def save_checkpoint(self, tag: str = "", *, timeout: float | None = None) -> trainer_pb2.SaveCheckpointReply:
        return self.unary("SaveCheckpoint", trainer_pb2.SaveCheckpointRequest(tag=tag), timeout=timeout, retry=False)
