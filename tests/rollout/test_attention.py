"""The rollout engine's grouped-query SDPA attention on CPU (rollout/attention.py): the same logits as transformers'
own SDPA attention for a left-padded batch, in a prefill and in a decode step over the cache, and the engine's model
runs it."""

from __future__ import annotations

import torch
from transformers import AttentionInterface, AutoModelForCausalLM

from zerobubble.rollout import attention
from zerobubble.rollout.engine_transformers import TransformersEngine


def padded_batch(rows: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    ids = torch.randint(3, 200, (rows, width))
    mask = torch.ones_like(ids)
    for row in range(rows):
        mask[row, :row * 3] = 0   # each row left-padded by a different amount
    return ids, mask


def prefill_then_decode(model, ids, mask) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.inference_mode():
        out = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                    use_cache=True)
        step = model(input_ids=out.logits[:, -1].argmax(-1, keepdim=True),
                     attention_mask=torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1),
                     position_ids=mask.sum(-1, keepdim=True), past_key_values=out.past_key_values, use_cache=True)
    # Logits at the padded positions mean nothing; only the real ones are compared.
    return out.logits[mask.bool()], step.logits[:, -1]


def test_grouped_sdpa_gives_transformers_sdpa_logits_for_a_padded_batch(tiny_model):
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    assert model.config.num_key_value_heads < model.config.num_attention_heads, "the case needs grouped heads"
    ids, mask = padded_batch(6, 24)
    assert model.config._attn_implementation == "sdpa"
    plain = prefill_then_decode(model, ids, mask)
    attention.use_grouped_sdpa(model)
    assert model.config._attn_implementation == attention.GROUPED_SDPA
    calls = []

    def counted(*args, **kwargs):
        calls.append(1)
        return attention.grouped_sdpa_forward(*args, **kwargs)

    AttentionInterface.register(attention.GROUPED_SDPA, counted)
    try:
        grouped = prefill_then_decode(model, ids, mask)
    finally:
        AttentionInterface.register(attention.GROUPED_SDPA, attention.grouped_sdpa_forward)
    assert len(calls) == 2 * model.config.num_hidden_layers
    for mine, theirs in zip(grouped, plain, strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5)


def test_the_transformers_engine_runs_grouped_sdpa_on_cpu(tiny_model):
    engine = TransformersEngine(tiny_model, seed=0)
    try:
        assert engine.model.config._attn_implementation == attention.GROUPED_SDPA
    finally:
        engine.close()
