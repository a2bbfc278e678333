"""save_state and loading it through the official client: a client made from a state computes what the saved one
did, Adam's state comes back with create_training_client_from_state_with_optimizer (and only with it), and a
state loaded into a client of other adapter settings is refused naming the path."""

from __future__ import annotations

import pytest
import tinker
from tinker import types
from tinker_data import DEADLINE, MODEL, next_token_datum, target_logprobs

pytestmark = pytest.mark.slow

ADAM = types.AdamParams(learning_rate=5e-3)


def _logprobs(client, probe) -> list[float]:
    return target_logprobs(client.forward(probe, "cross_entropy").result(DEADLINE))[0]


def _step(client, data) -> None:
    client.forward_backward(data, "cross_entropy").result(DEADLINE)
    client.optim_step(ADAM).result(DEADLINE)


@pytest.fixture(scope="module")
def saved(service_client):
    """A client after three steps, its state saved, the data and probe to compare clients on, and the probe's
    log-probs at the save."""
    client = service_client.create_lora_training_client(base_model=MODEL, rank=4, seed=21).result(DEADLINE)
    tokenizer = client.get_tokenizer()
    data = [next_token_datum(tokenizer.encode(text)) for text in ("12+30=42", "7+8=15")]
    for _ in range(3):
        _step(client, data)
    path = client.save_state("three-steps").result(DEADLINE).path
    probe = [next_token_datum(tokenizer.encode("20+22=42"))]
    return client, path, data, probe, _logprobs(client, probe)


def test_a_client_made_from_a_state_continues_where_the_saved_one_was(service_client, saved):
    original, path, data, probe, at_save = saved
    assert path.startswith("tinker://") and "/weights/" in path
    with_adam = service_client.create_training_client_from_state_with_optimizer(path).result(DEADLINE)
    without_adam = service_client.create_training_client_from_state(path).result(DEADLINE)
    assert with_adam.get_info().lora_rank == 4
    assert _logprobs(with_adam, probe) == pytest.approx(at_save, abs=1e-6)
    assert _logprobs(without_adam, probe) == pytest.approx(at_save, abs=1e-6)

    for client in (original, with_adam, without_adam):
        _step(client, data)
    after = _logprobs(original, probe)
    assert _logprobs(with_adam, probe) == pytest.approx(after, abs=1e-6)  # Adam's moments came back
    assert _logprobs(without_adam, probe) != pytest.approx(after, abs=1e-4)  # a fresh Adam steps otherwise


@pytest.mark.filterwarnings("ignore:DEPRECATED:FutureWarning")  # load_state: the legacy load into a client
def test_a_state_of_other_adapter_settings_is_refused_naming_the_path(service_client, saved):
    _, path, *_ = saved
    other = service_client.create_lora_training_client(base_model=MODEL, rank=8, seed=1).result(DEADLINE)
    with pytest.raises(tinker.RequestFailedError, match="path: the checkpoint's adapter"):
        other.load_state(path).result(DEADLINE)


def test_an_unknown_state_is_refused_naming_the_path(service_client):
    with pytest.raises(tinker.APIStatusError) as caught:
        service_client.create_training_client_from_state("tinker://nobody:train:0/weights/none").result(DEADLINE)
    assert caught.value.status_code == 404 and caught.value.body["field"] == "path"
