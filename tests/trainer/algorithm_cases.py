"""Shared cases for the algorithm tests: a tiny float64 policy, ragged batches laid out as the trainer pads them,
and a tiny real Qwen2 model."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from zerobubble.trainer.algorithms import token_logprobs_and_entropy

VOCAB = 13


class TinyPolicy(nn.Module):
    """A causal model small enough to compare gradients exactly: each position sees a running mean of the prefix."""

    def __init__(self, seed: int = 0, vocab: int = VOCAB, width: int = 6) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.embed = nn.Parameter(torch.randn(vocab, width, generator=generator, dtype=torch.float64))
        self.out = nn.Parameter(torch.randn(width, vocab, generator=generator, dtype=torch.float64))

    def forward(self, input_ids: Tensor) -> Tensor:
        hidden = self.embed[input_ids].cumsum(dim=1) / torch.arange(1, input_ids.size(1) + 1).reshape(1, -1, 1)
        return torch.tanh(hidden) @ self.out


@dataclass
class RaggedBatch:
    """Samples padded as the trainer collates them: [N, L] token ids, responses starting at different columns."""

    input_ids: Tensor
    response_start: Tensor
    response_mask: Tensor
    temperatures: Tensor
    old_logp: Tensor
    behaviour_logp: Tensor
    ref_logp: Tensor
    advantages: Tensor

    def rows(self, index: slice) -> RaggedBatch:
        return RaggedBatch(**{name: value[index] for name, value in vars(self).items()})


def ragged_batch(num_samples: int = 6, max_response: int = 5, seed: int = 1) -> RaggedBatch:
    generator = torch.Generator().manual_seed(seed)
    prompt_lengths = torch.randint(1, 4, (num_samples,), generator=generator)
    response_lengths = torch.randint(1, max_response + 1, (num_samples,), generator=generator)
    response_lengths[0] = max_response
    width = int((prompt_lengths + response_lengths).max())
    input_ids = torch.randint(0, VOCAB, (num_samples, width), generator=generator)
    mask = torch.arange(max_response).reshape(1, -1) < response_lengths.reshape(-1, 1)

    def noise(scale: float) -> Tensor:
        return scale * torch.randn(num_samples, max_response, generator=generator, dtype=torch.float64)

    return RaggedBatch(
        input_ids=input_ids,
        response_start=prompt_lengths,
        response_mask=mask,
        temperatures=torch.tensor([1.0, 0.95, 0.9, 1.1, 0.8, 1.0, 0.7, 1.2][:num_samples], dtype=torch.float64),
        # Old log-probs a little off the current policy, so that ratios differ from 1 and some tokens clip.
        old_logp=noise(0.3) - 2.5,
        behaviour_logp=noise(0.3) - 2.5,
        ref_logp=noise(0.3) - 2.5,
        advantages=torch.randn(num_samples, 1, generator=generator, dtype=torch.float64).expand(-1, max_response),
    )


def policy_logprobs(model: TinyPolicy, batch: RaggedBatch) -> Tensor:
    logits = model(batch.input_ids)
    return token_logprobs_and_entropy(
        logits, batch.input_ids, batch.response_start, batch.response_mask, batch.temperatures, with_entropy=False
    ).logprobs


def tiny_qwen2(seed: int = 0, vocab: int = 64):
    """A two-layer Qwen2 made here, in float64, that generates to max_new_tokens (no end-of-sequence token)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).double().eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model
