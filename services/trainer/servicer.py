"""TrainerService over gRPC: weight-sync membership goes to the broadcaster, status and checkpoints to
the training loop's control object. Nothing else happens here."""

from __future__ import annotations

from typing import Protocol

from zerobubble.common.status import translate_errors
from zerobubble.trainer.broadcaster import WeightBroadcaster
from zerobubble.v1 import trainer_pb2, trainer_pb2_grpc

SERVICE = trainer_pb2.DESCRIPTOR.services_by_name["TrainerService"]


class TrainerControl(Protocol):
    def status(self) -> dict:
        """At least `step`, `policy_version` and `last_checkpoint` (a path, or empty)."""
        ...

    def save_checkpoint(self, tag: str) -> tuple[str, int]:
        """Write a checkpoint now; its path and the step it holds."""
        ...


class TrainerServicer(trainer_pb2_grpc.TrainerServiceServicer):
    def __init__(self, broadcaster: WeightBroadcaster, control: TrainerControl, *, poll_seconds: float = 0.5):
        self.broadcaster = broadcaster
        self.control = control
        self.poll_seconds = poll_seconds

    @translate_errors
    def JoinWeightSync(self, request, context):
        info = self.broadcaster.join(request.worker_id, request.device)
        return trainer_pb2.JoinReply(
            rank=info.rank, world_size=info.world_size, group_epoch=info.group_epoch, store_host=info.store_host,
            store_port=info.store_port, backend=info.backend, member_timeout_seconds=info.member_timeout_s,
        )

    @translate_errors
    def WatchWeights(self, request, context):
        watch = self.broadcaster.watch(request.worker_id)
        # A worker that goes away cancels the stream; the callback drops it without waiting for a poll.
        context.add_callback(watch.close)
        try:
            while context.is_active():
                announcement = watch.next(self.poll_seconds)
                if watch.ended:
                    return
                if announcement is not None:
                    yield announcement
        finally:
            watch.close()

    @translate_errors
    def Status(self, request, context):
        training = self.control.status()
        sync = self.broadcaster.status()
        return trainer_pb2.TrainerStatusReply(
            step=training["step"], policy_version=training["policy_version"],
            last_checkpoint=training.get("last_checkpoint") or "", sync_members=sync["members"],
            last_sync_seconds=sync["last_sync_seconds"], synced_version=sync["synced_version"],
            group_epoch=sync["group_epoch"],
        )

    @translate_errors
    def SaveCheckpoint(self, request, context):
        path, step = self.control.save_checkpoint(request.tag)
        return trainer_pb2.SaveCheckpointReply(path=str(path), step=step)
