"""EnvironmentServicer: translates protobuf messages to the EpisodeService core and back. Opening and stepping run
users' code under a time limit, so they go to threads of their own: a slow environment holds no event loop."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor

from zerobubble.common.status import translate_errors
from zerobubble.environment.core import EpisodeService
from zerobubble.v1 import environment_pb2, environment_pb2_grpc

_ANSWER_MARGIN_S = 0.2


class EnvironmentServicer(environment_pb2_grpc.EnvironmentServiceServicer):
    def __init__(self, core: EpisodeService):
        self.core = core
        # One thread per episode that is opening or stepping, up to the episodes allowed at once.
        self._threads = ThreadPoolExecutor(core.config.limits.max_episodes, thread_name_prefix="episode")

    async def _run(self, function, *args):
        return await asyncio.get_running_loop().run_in_executor(self._threads, function, *args)

    async def ListEnvironments(self, request, context):
        infos = [environment_pb2.EnvironmentInfo(name=info.name, description=info.description,
                                                 tools_json=json.dumps(info.tools), tool_format=info.tool_format)
                 for info in self.core.infos.values()]
        return environment_pb2.ListEnvironmentsReply(environments=infos)

    @translate_errors
    async def OpenEpisode(self, request, context):
        episode_id, opening, tools = await self._run(self.core.open, request.environment, request.row_json)
        return environment_pb2.OpenEpisodeReply(episode_id=episode_id, opening_json=opening, tools_json=tools)

    @translate_errors
    async def StepEpisode(self, request, context):
        # Ends a little before the client's deadline, so that the client reads why rather than DEADLINE_EXCEEDED.
        left = context.time_remaining()
        client_seconds = None if left is None else left - _ANSWER_MARGIN_S
        step, reason = await self._run(self.core.step, request.episode_id, request.assistant_text, client_seconds)
        return environment_pb2.StepEpisodeReply(
            observation_json=json.dumps(step.observation, ensure_ascii=False), reward=step.reward, done=step.done,
            info_json=json.dumps(step.info, ensure_ascii=False), tool_calls=step.tool_calls, ended_reason=reason)

    @translate_errors
    async def CloseEpisode(self, request, context):
        await self._run(self.core.close, request.episode_id)
        return environment_pb2.CloseEpisodeReply()

    def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)
