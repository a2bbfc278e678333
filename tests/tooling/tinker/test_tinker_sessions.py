"""The Tinker core without HTTP, on the tiny model: a session no longer heard from ends and its training clients
are unloaded (another session's stay), its heartbeat then answers 410; one session holds at most
max_models_per_session training clients, and the front at most max_samplers samplers, the oldest going first."""

from __future__ import annotations

import asyncio

import pytest

from zerobubble.tooling.tinker import schema
from zerobubble.tooling.tinker.config import TinkerServerConfig
from zerobubble.tooling.tinker.errors import Refused
from zerobubble.tooling.tinker.service import TinkerService
from zerobubble.tooling.tiny.model import make_tiny_model

pytestmark = pytest.mark.slow


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _create(service: TinkerService, session_id: str, seq: int) -> str:
    request = schema.CreateModel(session_id=session_id, model_seq_id=seq, base_model="tiny",
                                 lora_config=schema.Lora(rank=2))
    return service.create_model(request)


@pytest.mark.filterwarnings("ignore:Adapter .* was active:UserWarning")  # peft, when the active adapter goes
def test_a_silent_session_ends_and_its_clients_are_unloaded(tmp_path):
    clock = Clock()
    config = TinkerServerConfig(model_name="tiny", model_dir=make_tiny_model(tmp_path / "model", size="1m", seed=0),
                                session_timeout_s=60, max_models_per_session=2, max_samplers=2)

    async def scenario():
        service = TinkerService(config, clock=clock)
        silent, alive = service.create_session(), service.create_session()
        for request_id in (_create(service, silent, 0), _create(service, silent, 1), _create(service, alive, 0)):
            assert (await service.futures.wait(request_id, 60)).failure is None
        with pytest.raises(Refused) as caught:
            _create(service, silent, 2)
        assert (caught.value.refusal.status, caught.value.refusal.field) == (403, "max_models_per_session")

        samplers = [service.create_sampling_session(schema.CreateSamplingSession(
            session_id=alive, sampling_session_seq_id=seq, base_model="tiny")) for seq in range(3)]
        assert list(service.sampling_sessions) == samplers[1:]
        with pytest.raises(Refused) as caught:
            service.sampling_session(samplers[0])
        assert (caught.value.refusal.status, caught.value.refusal.field) == (404, "sampling_session_id")

        clock.now += 45
        service.heartbeat(alive)
        clock.now += 30
        assert service.expire() == [silent]
        await asyncio.sleep(0)
        while any(model.session_id == silent for model in service.models.models.values()):
            await asyncio.sleep(0.05)
        assert [model.session_id for model in service.models.models.values()] == [alive]
        with pytest.raises(Refused) as caught:
            service.heartbeat(silent)
        assert (caught.value.refusal.status, caught.value.refusal.field) == (410, "session_id")
        service.close()

    asyncio.run(asyncio.wait_for(scenario(), 120))
