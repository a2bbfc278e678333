"""Typed client of the buffer service, for rollout workers, the trainer and tools."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
from pydantic import ValidationError

from zerobubble.common.allocator import keep_large_buffers_in_heap
from zerobubble.common.client import ServiceClient
from zerobubble.common.config import ClientConfig, ConfigError
from zerobubble.common.run_spec import RunSpec, model_expectations, require_agreement
from zerobubble.v1 import buffer_pb2, buffer_pb2_grpc, common_pb2

log = logging.getLogger(__name__)


@dataclass
class PullResult:
    groups: list[buffer_pb2.PulledGroup]
    end_of_data: bool
    rank: int = 0  # the rank they were delivered to, which alone may acknowledge them

    @property
    def last_delivery(self) -> int:
        return max((g.delivery for g in self.groups), default=0)

    @property
    def deliveries(self) -> list[int]:
        return [g.delivery for g in self.groups]

    def keeping(self, refused: Sequence[int]) -> PullResult:
        """The groups an acknowledgement did not refuse (the refused come again)."""
        if refused:
            log.warning("%d groups received were no longer ours to keep; they come again", len(refused))
        return PullResult([g for g in self.groups if g.delivery not in set(refused)], self.end_of_data, self.rank)


class BufferClient(ServiceClient):
    """`tune_allocator` keeps multi-megabyte buffers in this process's heap (see `keep_large_buffers_in_heap`):
    pulling 3.5 MiB groups otherwise spends half its CPU time faulting in fresh pages."""

    stub_class = buffer_pb2_grpc.BufferServiceStub

    def __init__(self, config: ClientConfig | str, *, tune_allocator: bool = True, retries: bool = True):
        if tune_allocator:
            keep_large_buffers_in_heap()
        super().__init__(config, retries=retries)

    def lease(self, worker_id: str, count: int, *, timeout: float | None = None) -> buffer_pb2.LeaseReply:
        return self.unary("LeasePrompts", buffer_pb2.LeaseRequest(worker_id=worker_id, count=count),
                          timeout=timeout)

    def complete(self, lease_id: str, prompt_ids: Sequence[str] = (), *,
                 timeout: float | None = None) -> None:
        """Finish prompts of a lease (all when none are named); those without a group go back to the queue."""
        self.unary("CompleteLease", buffer_pb2.CompleteLeaseRequest(lease_id=lease_id, prompt_ids=prompt_ids),
                   timeout=timeout)

    def push(
        self, groups: Iterable[common_pb2.ExperienceGroup], *, timeout: float | None = None
    ) -> Iterator[buffer_pb2.PushAck]:
        """One ack per group, in order. The stream is not retried: resend what was not acknowledged
        (same producer_id and sequence) on a new one, and it is stored once."""
        return self.stream("PushExperience", iter(groups), timeout=timeout)

    def pull(
        self, rank: int, world_size: int, max_groups: int, *, wait_seconds: float = 0.0,
        timeout: float | None = None,
    ) -> PullResult:
        """Up to `max_groups` groups, each acknowledged: they are the caller's to train on and commit (see
        `receive`). Raises when the acknowledgement failed: whether it reached the buffer is then unknown, so a
        caller that must neither lose nor repeat a group uses `receive` and retries `acknowledge` instead."""
        received = self.receive(rank, world_size, max_groups, wait_seconds=wait_seconds, timeout=timeout)
        if not received.groups:
            return received
        return received.keeping(self.acknowledge(received.deliveries, rank=rank, timeout=timeout))

    def receive(
        self, rank: int, world_size: int, max_groups: int, *, wait_seconds: float = 0.0,
        timeout: float | None = None,
    ) -> PullResult:
        """Up to `max_groups` groups, not yet acknowledged. A stream cut midway still gives the groups that
        came before the cut; raises only when none came."""
        request = buffer_pb2.PullRequest(rank=rank, world_size=world_size, max_groups=max_groups,
                                         wait_seconds=wait_seconds)
        # The server may rightly take wait_seconds before it answers: the deadline comes on top.
        replies = self.stream("PullBatch", request,
                              timeout=wait_seconds + (timeout or self.config.timeout_seconds))
        groups, end_of_data = [], False
        try:
            for reply in replies:
                if reply.end_of_data:
                    end_of_data = True
                else:
                    groups.append(reply)
        except grpc.RpcError as exc:
            if not groups:
                raise
            log.warning("a pull stream broke after %d groups (%s: %s); keeping them", len(groups),
                        exc.code().name, exc.details())
        return PullResult(groups, end_of_data, rank)

    def acknowledge(self, deliveries: Sequence[int], *, rank: int = 0, timeout: float | None = None,
                    retry: bool | None = None) -> list[int]:
        """Claim received groups; returns the deliveries that may not be kept (the buffer will send them
        again). Acknowledging one twice is harmless, so a call that failed may be repeated until it answers."""
        reply = self.unary("Acknowledge", buffer_pb2.AcknowledgeRequest(deliveries=deliveries, rank=rank),
                           timeout=timeout,
                           retry=retry)
        return list(reply.refused)

    def commit(self, delivery: int, *, resume: bool = False, timeout: float | None = None) -> None:
        self.unary("Commit", buffer_pb2.CommitRequest(delivery=delivery, resume=resume), timeout=timeout)

    def set_policy_version(self, version: int, *, training_finished: bool = False,
                           timeout: float | None = None) -> None:
        self.unary("SetPolicyVersion", buffer_pb2.SetPolicyVersionRequest(
            version=version, training_finished=training_finished), timeout=timeout)

    def stats(self, *, timeout: float | None = None) -> buffer_pb2.StatsReply:
        return self.unary("Stats", buffer_pb2.StatsRequest(), timeout=timeout)

    def run_spec(self, *, timeout: float | None = None) -> RunSpec:
        """The run's spec as the buffer holds it; ConfigError when this version cannot read it."""
        # At a service's start, before it has anything to stop: the buffer may be starting too.
        reply = self.first_call("GetRunSpec", buffer_pb2.GetRunSpecRequest(), peer="buffer", field="buffer",
                                timeout=timeout)
        try:
            return RunSpec.model_validate_json(reply.spec_json)
        except ValidationError as exc:
            fields = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            raise ConfigError(f"the run spec from the buffer at {self.config.address} is not one this version "
                              f"reads: {fields}") from None

    def agreed_run_spec(self, expectations: dict[str, tuple[str, object]], *, model: Path,
                        model_field: str) -> RunSpec:
        """The run spec, once the caller's `expectations` (see require_agreement) and its model folder `model`
        (the config's `model_field`) agree with it; RunSpecMismatch names every disagreement."""
        spec = self.run_spec()
        require_agreement(spec, {**expectations, **model_expectations(spec, model, model_field)},
                          source=f"the buffer at {self.config.address}")
        return spec
