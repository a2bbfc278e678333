"""TrainerService over gRPC: weight-sync membership goes to the broadcaster, status and checkpoints to
the training loop's control object. Nothing else happens here."""

from __future__ import annotations

from typing import Protocol

from zerobubble.common.errors import Unavailable
from zerobubble.common.status import translate_errors
from zerobubble.trainer.broadcaster import WeightBroadcaster
from zerobubble.v1 import trainer_pb2, trainer_pb2_grpc

SERVICE = trainer_pb2.DESCRIPTOR.services_by_name["TrainerService"]
# TrainerControl.status()'s state once the data or max_steps ran out.
FINISHED = "finished"


class TrainerControl(Protocol):
    def status(self) -> dict:
        """At least `step`, `policy_version` and `last_checkpoint` (a path, or empty)."""
        ...

    def save_checkpoint(self, tag: str) -> tuple[str, int]:
        """Write a checkpoint now; its path and the step it holds."""
        ...


class TrainerServicer(trainer_pb2_grpc.TrainerServiceServicer):
    def __init__(self, broadcaster: WeightBroadcaster | None, control: TrainerControl):
        """`broadcaster` is None on a trainer without weight sync, and on every rank but the first."""
        self.broadcaster = broadcaster
        self.control = control

    def _sync(self) -> WeightBroadcaster:
        if self.broadcaster is None:
            raise Unavailable("this trainer process broadcasts no weights (weight_sync is null, or it is not rank 0)")
        return self.broadcaster

    def _finished(self) -> None:
        """Refuse once training is over: a worker told so waits long before asking again, where one that is
        only told "unavailable" (a trainer restarting) comes back within its backoff."""
        if self.control.status()["state"] == FINISHED:
            raise Unavailable("training has finished: this trainer publishes no more weights")

    @translate_errors
    def JoinWeightSync(self, request, context):
        self._finished()
        info = self._sync().join(request.worker_id, request.device)
        return trainer_pb2.JoinReply(
            rank=info.rank, world_size=info.world_size, group_epoch=info.group_epoch, store_host=info.store_host,
            store_port=info.store_port, backend=info.backend, member_timeout_seconds=info.member_timeout_s,
        )

    @translate_errors
    async def WatchWeights(self, request, context):
        # A coroutine: an idle watch holds no server thread, and a worker that goes away cancels the call,
        # which ends in the `finally` and drops the member at once.
        watch = self._sync().watch(request.worker_id)
        try:
            # Headers now: the worker knows its watch is registered before any weights exist.
            await context.send_initial_metadata(())
            while (announcement := await watch.next()) is not None:
                await context.write(announcement)
        finally:
            watch.close()
        # The stream ends with why, when it is the end of training, so the worker need not ask again to learn it.
        self._finished()

    @translate_errors
    def Status(self, request, context):
        training = self.control.status()
        sync = {}
        if self.broadcaster is not None:
            figures = self.broadcaster.status()
            sync = {"sync_members": figures["members"], "last_sync_seconds": figures["last_sync_seconds"],
                    "synced_version": figures["synced_version"], "group_epoch": figures["group_epoch"]}
        return trainer_pb2.TrainerStatusReply(
            step=training["step"], policy_version=training["policy_version"],
            last_checkpoint=training.get("last_checkpoint") or "", state=training["state"], **sync,
        )

    @translate_errors
    def SaveCheckpoint(self, request, context):
        path, step = self.control.save_checkpoint(request.tag)
        return trainer_pb2.SaveCheckpointReply(path=str(path), step=step)
