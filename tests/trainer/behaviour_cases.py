"""Experience whose behaviour log-probs are the tiny model's own, shifted where a test says: an engine gap injected
on chosen tokens, with the model's exact log-probs to compute the expected losses and figures by hand."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from strategy_helpers import VOCAB
from transformers import AutoModelForCausalLM

from zerobubble.common.codec import encode_array
from zerobubble.trainer.sequences import padded_inputs
from zerobubble.v1 import common_pb2

GROUPS, GENERATIONS = 2, 4


def behaviour_groups(model_dir, shift: Callable[[int, int, int], float] | float,
                     versions: tuple[int, ...] = (0,) * GROUPS) -> list[common_pb2.ExperienceGroup]:
    """GROUPS groups of GENERATIONS ragged responses; token t of trajectory i of group g has the behaviour log-prob
    log pi(token) - shift(g, i, t) (a number: that shift everywhere), so its behaviour weight is e^shift. Group g
    was drawn by weights versions[g]."""
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    rng = np.random.default_rng(0)
    groups = []
    for g in range(GROUPS):
        prompt = rng.integers(3, VOCAB, 4, dtype=np.int32)
        group = common_pb2.ExperienceGroup(prompt_ids=encode_array(prompt))
        for i in range(GENERATIONS):
            response = rng.integers(3, VOCAB, 3 + i % 2, dtype=np.int32)
            ids = torch.tensor(np.concatenate([prompt, response]))[None].long()
            with torch.no_grad():
                logp = torch.log_softmax(model(ids).logits[0, len(prompt) - 1:-1].double(), -1)
            own = logp.gather(1, torch.tensor(response).long()[:, None]).squeeze(1).numpy()
            shifts = np.array([shift(g, i, t) if callable(shift) else shift for t in range(len(response))])
            group.trajectories.add(
                response_ids=encode_array(response),
                behaviour_logprobs=encode_array((own - shifts).astype(np.float32)),
                finish_reason=common_pb2.FINISH_REASON_STOP, reward=float((i + g) % 2), temperature=1.0,
                policy_version=versions[g])
        groups.append(group)
    return groups


def own_logprobs(model_dir, batch) -> torch.Tensor:
    """[N, T] the model's log-probs of the batch's response tokens (float64, one plain forward)."""
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    input_ids, attention_mask, position_ids, prompt_width = padded_inputs(batch, batch.response_mask.size(1))
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=attention_mask,
                       position_ids=position_ids).logits[:, prompt_width - 1:-1].double()
    return torch.log_softmax(logits, -1).gather(2, input_ids[:, prompt_width:, None]).squeeze(-1)
