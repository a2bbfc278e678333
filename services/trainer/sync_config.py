"""The weight broadcast's configuration schema, apart from the broadcaster so that reading a config loads no
torch.distributed."""

from __future__ import annotations

from pydantic import Field

from zerobubble.common.config import Schema


class WeightSyncConfig(Schema):
    store_host: str = Field("127.0.0.1", description="where the TCPStore listens (0.0.0.0: every interface)")
    store_port: int = Field(0, ge=0, lt=65536, description="0 picks a free port")
    advertise_host: str | None = Field(
        None, description="the address workers reach this trainer at (store and gloo); default store_host, "
                          "or this host's name when store_host is 0.0.0.0")
    bucket_mb: float = Field(256.0, gt=0, description="size of one broadcast bucket")
    member_timeout_s: float = Field(
        30.0, gt=0, description="a member of a formed group that does not acknowledge a version within this "
                                "long is dropped; also bounds every collective")
    formation_timeout_s: float = Field(
        5.0, gt=0, description="a member that does not arrive at a new group epoch within this long is dropped, "
                               "and the group forms without it")
    max_members: int = Field(64, gt=0, description="rollout workers in the broadcast group at most; joins "
                                                   "beyond it are refused (RESOURCE_EXHAUSTED)")
    device: str = Field("cpu", description="where the send buffers live: cuda:N broadcasts over NCCL, cpu over gloo")
    max_attempts: int = Field(3, ge=1, description="tries of one version after failed broadcasts that dropped nobody")
