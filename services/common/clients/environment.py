"""Typed client of the environment service, for rollout workers and tools. Listing and closing are retried while
the service is unavailable (doing them twice changes nothing); opening and stepping are not: a retried open could
leave an episode nobody holds, and a retried step would step the environment twice. The episode driver retries an
open only where the service answered that it opened nothing (rollout/episodes/remote.py)."""

from __future__ import annotations

import json
from typing import Any

from zerobubble.common.client import ServiceClient
from zerobubble.v1 import environment_pb2, environment_pb2_grpc


class EnvironmentClient(ServiceClient):
    stub_class = environment_pb2_grpc.EnvironmentServiceStub

    def list_environments(self, *, timeout: float | None = None) -> environment_pb2.ListEnvironmentsReply:
        return self.unary("ListEnvironments", environment_pb2.ListEnvironmentsRequest(), timeout=timeout)

    def open_episode(self, environment: str, row: dict[str, Any], *,
                     timeout: float | None = None) -> environment_pb2.OpenEpisodeReply:
        """`row`: the prompt row (messages, ground_truth, data_source, other columns)."""
        request = environment_pb2.OpenEpisodeRequest(environment=environment, row_json=json.dumps(row))
        return self.unary("OpenEpisode", request, timeout=timeout, retry=False)

    def step_episode(self, episode_id: str, assistant_text: str, *,
                     timeout: float | None = None) -> environment_pb2.StepEpisodeReply:
        request = environment_pb2.StepEpisodeRequest(episode_id=episode_id, assistant_text=assistant_text)
        return self.unary("StepEpisode", request, timeout=timeout, retry=False)

    def close_episode(self, episode_id: str, *, timeout: float | None = None) -> None:
        self.unary("CloseEpisode", environment_pb2.CloseEpisodeRequest(episode_id=episode_id), timeout=timeout)
