"""The buffer service's configuration schema (all defaults are here)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from zerobubble.common.config import Schema, ServerConfig
from zerobubble.common.data_spec import DataSpec
from zerobubble.common.run_spec import RunSpec


class PromptsConfig(DataSpec):
    """The training set (path, split, columns, skip_bad_rows) and the order it is handed out in."""

    epochs: int = Field(1, gt=0, description="passes over the data; each has its own seeded order")
    seed: int = Field(0, description="the order of epoch e is a permutation drawn from (seed, e)")
    shuffle: bool = True


class LeasesConfig(Schema):
    timeout_seconds: float = Field(600.0, gt=0, description="unfinished prompts of a lease return after this")
    max_prompts: int = Field(1024, gt=0, description="most prompts one LeasePrompts call may ask for")


class CapacityConfig(Schema):
    """What the buffer holds before pushes wait and leases stop; bounds its memory."""

    max_groups: int = Field(1024, gt=0, description="queued (not yet pulled) groups")
    max_bytes: int = Field(2 * 1024**3, gt=0, description="queued bytes (serialized groups)")
    max_group_bytes: int = Field(32 * 1024 * 1024, gt=0, description="a larger group is refused")
    max_producers: int = Field(10_000, gt=0, description="producers whose recent sequence numbers are "
                               "remembered for deduplication; the least recently seen is forgotten")
    dedup_window: int = Field(65_536, gt=0, description="sequence numbers remembered per producer; one "
                              "older than the newest minus this is treated as a duplicate")


class PushConfig(Schema):
    read_ahead: int = Field(
        2, ge=0, description="groups a push stream receives while the one before them is stored, so the network "
        "and the log work at once; each stream holds up to this many more groups in memory (0: none)"
    )


class PullConfig(Schema):
    max_groups: int = Field(4096, gt=0, description="most groups one PullBatch (or Acknowledge) may ask for")
    max_wait_seconds: float = Field(600.0, ge=0, description="longest wait_seconds a PullBatch may ask for")
    ack_timeout_seconds: float = Field(
        30.0, gt=0, description="a group sent by PullBatch and not acknowledged this long after its stream "
        "ended goes back to the head of the queue (it was lost on the way, or its receiver died)"
    )


class ValidationConfig(Schema):
    """What a pushed group may hold: anything else is refused in its ack, naming the field."""

    max_trajectories: int = Field(1024, gt=0, description="trajectories per group")
    max_prompt_tokens: int = Field(131_072, gt=0, description="tokens of a group's prompt")
    max_response_tokens: int = Field(131_072, gt=0, description="tokens of one trajectory's response")
    max_version_ahead: int = Field(
        0, ge=0, description="a trajectory's policy_version may be at most this far ahead of the buffer's; queued "
        "groups further ahead are dropped when the trainer's version goes back. Ahead at all only after a trainer "
        "went back to an older checkpoint, or another run's trainer came to this buffer: weights the trainer does "
        "not have made such groups"
    )
    max_version_jump: int = Field(1_000_000, gt=0, description="SetPolicyVersion may move the policy version "
                                  "forward by at most this")


class WalConfig(Schema):
    directory: Path = Field(Path("buffer-wal"), description="where the write-ahead log lives")
    fsync: Literal["always", "interval", "never"] = Field(
        "interval",
        description="always: fsync before every acknowledgement; interval: at most every interval_seconds "
        "(a process crash loses nothing either way, a machine crash up to that interval); never: leave it "
        "to the operating system",
    )
    interval_seconds: float = Field(1.0, gt=0)
    segment_bytes: int = Field(256 * 1024 * 1024, gt=0, description="the log starts a new segment file once "
                               "the current one holds this many bytes; a segment is deleted once none of its "
                               "groups is queued or awaiting the trainer's commit")
    reuse_files: bool = Field(True, description="a deleted segment's file becomes the next segment (already "
                              "allocated and cached: about half the cost of deleting it and writing a new file)")


class BufferServiceConfig(Schema):
    # Every open push stream and pull stream holds a server thread, hence more than the default.
    server: ServerConfig = ServerConfig(listen="127.0.0.1:50053", max_workers=64)
    prompts: PromptsConfig
    leases: LeasesConfig = LeasesConfig()
    capacity: CapacityConfig = CapacityConfig()
    run_spec: RunSpec = Field(RunSpec(), description="what every service of the run must agree on; the buffer "
                              "enforces the group size, the staleness bound, the filter range and the vocabulary, "
                              "and serves the whole spec to workers and the trainer (GetRunSpec)")
    push: PushConfig = PushConfig()
    pull: PullConfig = PullConfig()
    validation: ValidationConfig = ValidationConfig()
    wal: WalConfig = WalConfig()

    @model_validator(mode="after")
    def _group_fits_in_a_message(self) -> BufferServiceConfig:
        if self.capacity.max_group_bytes >= self.server.max_message_bytes:
            raise ValueError("capacity.max_group_bytes must be below server.max_message_bytes, so that an "
                             "oversized group is refused alone instead of breaking its stream")
        if self.capacity.max_group_bytes > self.capacity.max_bytes:
            raise ValueError("capacity.max_group_bytes must not exceed capacity.max_bytes")
        if self.run_spec.num_generations > self.validation.max_trajectories:
            raise ValueError("run_spec.num_generations must not exceed validation.max_trajectories")
        return self
