"""The rollout engine's attention on CPU: transformers' SDPA attention, with grouped-query heads handed to SDPA as they
are (`enable_gqa`) under a padding mask too.

transformers repeats the key and value heads of a grouped-query model whenever a mask is given (its
`use_gqa_in_sdpa`, for CUDA's fused kernels, which take no mask with groups), and the repeat copies the layer's whole
cache at every decode step. Padded batches always carry a mask, and a continuous batch is a wide padded one: on CPU,
SDPA's masked kernel takes the groups itself, 4x faster at 88 requests over 300 positions (1 thread), with the same
values to float rounding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

GROUPED_SDPA = "zerobubble_grouped_sdpa"


def grouped_sdpa_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                         attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                         is_causal: bool | None = None, **_: object) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: query [batch, heads, q, dim], key and value [batch, kv_heads, k,
    dim]; out [batch, q, heads, dim]."""
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    # As transformers does: SDPA's causal flag only for a prefill without a mask.
    causal = query.shape[2] > 1 and attention_mask is None and causal
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                         scale=scaling, is_causal=causal, enable_gqa=key.shape[1] != query.shape[1])
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(GROUPED_SDPA, grouped_sdpa_forward)
ALL_MASK_ATTENTION_FUNCTIONS.register(GROUPED_SDPA, sdpa_mask)


def use_grouped_sdpa(model: torch.nn.Module) -> None:
    """On CPU, where SDPA takes grouped heads under a mask, for a model that runs transformers' SDPA attention."""
    if model.device.type == "cpu" and model.config._attn_implementation == "sdpa":
        model.set_attn_implementation(GROUPED_SDPA)
