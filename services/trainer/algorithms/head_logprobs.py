"""Log-probs and entropy of chosen tokens straight from the last hidden states, through the output projection a
chunk of positions at a time: `[positions, vocabulary]` logits exist for one chunk only, in the forward and in the
backward (which recomputes each chunk's logits from the saved hidden states instead of keeping them).

A custom autograd function rather than Liger's fused linear cross-entropy: Liger's kernels are Triton (GPU only),
return a reduced loss rather than per-token log-probs with their entropy, and take one temperature per call, where
every sample here has its own. This one runs wherever torch does; on a GPU its matrix products are the same cuBLAS
calls the full-logits path makes, one chunk at a time.
"""

from __future__ import annotations

import torch
from torch import Tensor

from zerobubble.trainer.algorithms.logprobs import support_mask


def _matmul_dtype(hidden: Tensor, weight: Tensor) -> torch.dtype:
    # Under autocast (the strategy's bf16 over fp32 weights) the output projection runs in the autocast dtype,
    # as the model's own lm_head would; otherwise in the dtype the tensors have.
    device = hidden.device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return torch.promote_types(hidden.dtype, weight.dtype)


def _scaled_logits(hidden: Tensor, weight: Tensor, inverse_temperature: Tensor, dtype: torch.dtype) -> Tensor:
    # One [chunk, vocabulary] tensor, scaled in place.
    logits = (hidden.to(dtype) @ weight.to(dtype).t()).to(torch.promote_types(dtype, torch.float32))
    return logits.mul_(inverse_temperature.to(logits.dtype).unsqueeze(1))


def _replayed(scaled: Tensor, targets: Tensor, kept: Tensor | None) -> Tensor | None:
    # The tokens outside the engine's support get -inf in place: their probability is 0 in the forward and, the
    # same mask recomputed from the same logits, in the backward. Returns the mask (None: nothing cut).
    keep = None if kept is None else support_mask(scaled, targets, kept)
    if keep is not None:
        scaled.masked_fill_(~keep, float("-inf"))
    return keep


class ChunkedTokenLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, targets: Tensor, inverse_temperature: Tensor,
                kept: Tensor | None, chunk: int, with_entropy: bool):
        dtype = _matmul_dtype(hidden, weight)
        logprobs, normalisers, entropies = [], [], []
        with torch.autocast(hidden.device.type, enabled=False):
            for start in range(0, hidden.size(0), chunk):
                rows = slice(start, start + chunk)
                scaled = _scaled_logits(hidden[rows], weight, inverse_temperature[rows], dtype)
                keep = _replayed(scaled, targets[rows], None if kept is None else kept[rows])
                log_normaliser = torch.logsumexp(scaled, dim=-1)
                logprobs.append(scaled.gather(1, targets[rows].unsqueeze(1)).squeeze(1) - log_normaliser)
                normalisers.append(log_normaliser)
                if with_entropy:
                    # H = logZ - sum(p * z); outside a replayed support p = 0 and z = -inf, read as 0 (no 0 * inf).
                    probs = torch.sub(scaled, log_normaliser.unsqueeze(1)).exp_()
                    finite = scaled if keep is None else scaled.masked_fill(~keep, 0.0)
                    expected = torch.bmm(probs.unsqueeze(1), finite.unsqueeze(2)).reshape(-1)
                    entropies.append(log_normaliser - expected)
                    del probs
                del scaled
        out_dtype = torch.promote_types(dtype, torch.float32)
        empty = hidden.new_zeros(0, dtype=out_dtype)
        logprobs = torch.cat(logprobs) if logprobs else empty
        entropy = torch.cat(entropies) if entropies else empty.clone()
        ctx.save_for_backward(hidden, weight, targets, inverse_temperature,
                              torch.cat(normalisers) if normalisers else empty, kept)
        ctx.chunk, ctx.dtype = chunk, dtype
        ctx.mark_non_differentiable(entropy)
        return logprobs, entropy

    @staticmethod
    def backward(ctx, grad_logprobs: Tensor, _grad_entropy: Tensor):
        hidden, weight, targets, inverse_temperature, normalisers, kept = ctx.saved_tensors
        chunk, dtype = ctx.chunk, ctx.dtype
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.promote_types(dtype, torch.float32),
                                  device=weight.device) if ctx.needs_input_grad[1] else None
        with torch.autocast(hidden.device.type, enabled=False):
            for start in range(0, hidden.size(0), chunk):
                rows = slice(start, start + chunk)
                scaled = _scaled_logits(hidden[rows], weight, inverse_temperature[rows], dtype)
                _replayed(scaled, targets[rows], None if kept is None else kept[rows])
                # d logp(y) / d logit = (onehot(y) - softmax(logits / T)) / T, times the upstream gradient.
                upstream = grad_logprobs[rows].to(scaled.dtype).unsqueeze(1)
                grad = scaled.sub_(normalisers[rows].unsqueeze(1)).exp_().mul_(-upstream)
                grad.scatter_add_(1, targets[rows].unsqueeze(1), upstream)
                grad = grad.mul_(inverse_temperature[rows].to(grad.dtype).unsqueeze(1)).to(dtype)
                if grad_hidden is not None:
                    grad_hidden[rows] = (grad @ weight.to(dtype)).to(hidden.dtype)
                if grad_weight is not None and grad_weight.dtype == dtype:
                    grad_weight.addmm_(grad.t(), hidden[rows].to(dtype))  # in place: no [V, H] temporary
                elif grad_weight is not None:
                    grad_weight += (grad.t() @ hidden[rows].to(dtype)).to(grad_weight.dtype)
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None, None, None


def chunked_token_logprobs(hidden: Tensor, weight: Tensor, targets: Tensor, temperatures: Tensor, *,
                           chunk: int, with_entropy: bool,
                           support: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
    """Log-probs of `targets` [M] under softmax(hidden [M, H] @ weight [V, H]^T / temperatures [M]) with gradients
    for hidden and weight, and (detached) the entropy of each row's distribution; `chunk` rows at a time. support
    [M]: the tokens each row's sampling kept (logprobs.support_mask; None: the whole vocabulary)."""
    if chunk < 1:
        raise ValueError(f"chunk must be at least 1, got {chunk}")
    logprobs, entropy = ChunkedTokenLogprobs.apply(hidden, weight, targets, temperatures.double().reciprocal(), support,
                                                   chunk, with_entropy)
    return logprobs, entropy if with_entropy else None
