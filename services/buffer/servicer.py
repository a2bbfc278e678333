"""BufferService over gRPC: translates messages and calls the core, nothing more.

The two streams are coroutines: a pull waiting for groups, or a push stream waiting for its next group
or for room in the buffer, waits on the core's condition and holds no thread. The core's blocking work
(checking a group, writing the log) runs on the host's threads, and only while there is some.

Groups keep their wire bytes through the buffer: a pushed group is parsed to be checked but the log
stores the bytes that arrived, and a pulled group leaves as those bytes again. A 3.5 MiB group is
then never serialized by the buffer, which roughly halves its cost per group.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import grpc
from google.protobuf.message import DecodeError
from google.protobuf.message_factory import GetMessageClass

from zerobubble.buffer.core import Buffer, PreparedGroup, Pulled, PushOutcome
from zerobubble.buffer.metrics import BufferMetrics
from zerobubble.buffer.read_ahead import read_ahead
from zerobubble.common.codec import varint
from zerobubble.common.errors import InvalidInput, ServiceError
from zerobubble.common.not_stored import not_stored_label
from zerobubble.common.status import status_of, translate_errors
from zerobubble.v1 import buffer_pb2, buffer_pb2_grpc, common_pb2

SERVICE = buffer_pb2.DESCRIPTOR.services_by_name["BufferService"]
GROUP_TAG = b"\x0a"  # PulledGroup.group: field 1, length-delimited


@dataclass(frozen=True)
class WireGroup:
    """A pushed group parsed, with the bytes it came in; `group` is None when they are no ExperienceGroup
    (refused in that group's ack: a failed deserializer would end the whole stream with INTERNAL)."""

    payload: bytes
    group: common_pb2.ExperienceGroup | None

    @classmethod
    def parse(cls, payload: bytes) -> WireGroup:
        try:
            return cls(payload, common_pb2.ExperienceGroup.FromString(payload))
        except DecodeError:
            return cls(payload, None)


def pulled_group_bytes(item: Pulled) -> bytes:
    """A serialized PulledGroup around the stored group bytes (protobuf fields may come in any order)."""
    if item.payload is None:
        return buffer_pb2.PulledGroup(end_of_data=True).SerializeToString()
    head = buffer_pb2.PulledGroup(delivery=item.delivery).SerializeToString()
    return b"".join([head, GROUP_TAG, varint(len(item.payload)), item.payload])


class BufferServicer(buffer_pb2_grpc.BufferServiceServicer):
    def __init__(self, core: Buffer, metrics: BufferMetrics):
        self.core = core
        self.metrics = metrics

    @translate_errors
    def LeasePrompts(self, request, context):
        grant = self.core.lease_prompts(request.worker_id, request.count)
        return buffer_pb2.LeaseReply(
            lease_id=grant.lease_id,
            prompts=grant.prompts,
            expires_in_seconds=grant.expires_in_seconds,
            end_of_data=grant.end_of_data,
            policy_version=grant.policy_version,
            epoch_size=grant.epoch_size,
            epoch_finished=grant.epoch_finished,
            training_finished=grant.training_finished,
        )

    @translate_errors
    def CompleteLease(self, request, context):
        self.core.complete_lease(request.lease_id, request.prompt_ids)
        return buffer_pb2.CompleteLeaseReply()

    @translate_errors
    async def PushExperience(self, request_iterator, context):
        # A bad group is refused in its own ack so the groups around it, and the stream, go on.
        async with read_ahead(request_iterator, self.core.config.push.read_ahead) as groups:
            async for wire in groups:
                started = time.perf_counter()
                ack = buffer_pb2.PushAck()
                try:
                    if wire.group is None:
                        raise InvalidInput(f"{len(wire.payload)} bytes that are no ExperienceGroup", field="group")
                    ack.producer_id, ack.sequence = wire.group.producer_id, wire.group.sequence
                    outcome = await self._push(wire)
                except ServiceError as exc:
                    ack.code = status_of(exc).value[0]
                    ack.error = str(exc)
                else:
                    ack.stored = outcome.stored
                    ack.filtered = outcome.filtered
                    ack.not_stored = outcome.not_stored
                    if not outcome.stored:
                        self.metrics.not_stored.labels(reason=not_stored_label(outcome.not_stored)).inc()
                self.metrics.push_seconds.observe(time.perf_counter() - started)
                await context.write(ack)

    async def _push(self, wire: WireGroup) -> PushOutcome:
        def first_try() -> tuple[PreparedGroup, PushOutcome | None]:
            prepared = self.core.prepare_push(wire.group, wire.payload)
            return prepared, self.core.try_push(prepared)

        # One trip to a thread per group unless the buffer is full.
        prepared, outcome = await asyncio.to_thread(first_try)
        while outcome is None:
            # The trainer is behind. A caller that leaves cancels this wait; nothing is stored.
            await self.core.wait_until(lambda: self.core.has_room(prepared), None)
            outcome = await asyncio.to_thread(self.core.try_push, prepared)
        return outcome

    @translate_errors
    async def PullBatch(self, request, context):
        started = time.perf_counter()
        stream = self.core.open_pull(request.rank, request.world_size, request.max_groups, request.wait_seconds)
        # Headers at once: the caller sees the stream is being served while it waits for groups.
        await context.send_initial_metadata(())
        try:
            while stream.wanted:
                # Whatever is there now, in one trip to a thread.
                items = await asyncio.to_thread(stream.take_all)
                if not items:
                    if not stream.may_wait():
                        return
                    await self.core.wait_until(stream.ready, stream.wait_seconds())
                for item in items:
                    if item.payload is not None:
                        self.metrics.pull_seconds.observe(time.perf_counter() - started)
                    await context.write(pulled_group_bytes(item))
                    if item.payload is None:
                        return
        finally:
            stream.close()

    @translate_errors
    def Acknowledge(self, request, context):
        return buffer_pb2.AcknowledgeReply(refused=self.core.acknowledge(request.deliveries, request.rank))

    @translate_errors
    def Commit(self, request, context):
        self.core.commit(request.delivery, resume=request.resume)
        return buffer_pb2.CommitReply()

    @translate_errors
    def SetPolicyVersion(self, request, context):
        self.core.set_policy_version(request.version, request.training_finished)
        return buffer_pb2.SetPolicyVersionReply()

    @translate_errors
    def Stats(self, request, context):
        return buffer_pb2.StatsReply(**self.core.stats())

    @translate_errors
    def GetRunSpec(self, request, context):
        return buffer_pb2.GetRunSpecReply(spec_json=self.core.config.run_spec.model_dump_json())


HANDLER_KINDS = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}
WIRE_CODECS = {"PushExperience": (WireGroup.parse, None), "PullBatch": (None, bytes)}


def register(servicer: BufferServicer, server: grpc.Server) -> None:
    """What the generated add_BufferServiceServicer_to_server does, with the wire codecs above."""
    handlers = {}
    for method in SERVICE.methods:
        deserialize, serialize = WIRE_CODECS.get(method.name, (None, None))
        handlers[method.name] = HANDLER_KINDS[method.client_streaming, method.server_streaming](
            getattr(servicer, method.name),
            request_deserializer=deserialize or GetMessageClass(method.input_type).FromString,
            response_serializer=serialize or GetMessageClass(method.output_type).SerializeToString,
        )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE.full_name, handlers),))
    server.add_registered_method_handlers(SERVICE.full_name, handlers)
