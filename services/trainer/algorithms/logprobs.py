"""Log-probabilities of the response tokens and the entropy of the distributions that produced them, over the
whole vocabulary or over the support the engine sampled from (its sampling mask, replayed)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

ENTROPY_CHUNK_ROWS = 4


@dataclass(frozen=True)
class TokenLogprobs:
    """[N, T] tensors over response positions, zero where the response mask is zero."""

    logprobs: Tensor
    entropy: Tensor | None


def support_mask(scaled: Tensor, targets: Tensor, kept: Tensor) -> Tensor | None:
    """[..., V] bool: each row's `kept` largest logits, the support top-k / top-p left to the engine (rows with kept 0
    or kept >= V keep the whole vocabulary); None when no row is cut.

    The engine records a count, not the token ids: top-k and top-p both keep a prefix of the tokens sorted by
    logit / temperature, so the count names the set as long as the trainer orders the tokens as the engine did, and
    costs 4 bytes a token where the ids cost 4 per kept token. Where the two numerics order the boundary
    differently, the set differs by tokens of the smallest kept probability; the drawn token is always kept, so
    its log-prob stays finite.
    """
    vocabulary = scaled.size(-1)
    cut = (kept > 0) & (kept < vocabulary)
    if not bool(cut.any()):
        return None
    widest = int(kept[cut].max())
    kth = torch.topk(scaled, widest, dim=-1).values.gather(-1, (kept.clamp(1, widest) - 1).unsqueeze(-1))
    keep = (scaled >= kth) | ~cut.unsqueeze(-1)
    return keep.scatter_(-1, targets.unsqueeze(-1), True)


def response_logits(logits: Tensor, response_start: Tensor, num_tokens: int) -> Tensor:
    """The logits that predict the response tokens: row t of the result predicts token response_start + t.

    logits[:, p] predicts input_ids[:, p + 1], so response token t of sample i is predicted by
    logits[i, response_start[i] + t - 1]. Responses starting in one column (left-padded prompts) give a view.
    """
    length = logits.size(1)
    if bool((response_start < 1).any()):
        raise ValueError("every sample needs at least one prompt token before its response (response_start >= 1)")
    first = response_start - 1
    if bool((first == first[0]).all()) and int(first[0]) + num_tokens <= length:
        return logits[:, int(first[0]) : int(first[0]) + num_tokens]
    positions = (first.unsqueeze(1) + torch.arange(num_tokens, device=logits.device)).clamp(max=length - 1)
    return logits.gather(1, positions.unsqueeze(-1).expand(-1, -1, logits.size(-1)))


def response_tokens(input_ids: Tensor, response_start: Tensor, num_tokens: int) -> Tensor:
    """input_ids[i, response_start[i] + t] as [N, num_tokens] (positions past the end read the last column)."""
    positions = (response_start.unsqueeze(1) + torch.arange(num_tokens, device=input_ids.device))
    return input_ids.gather(1, positions.clamp(max=input_ids.size(1) - 1))


def token_logprobs_and_entropy(
    logits: Tensor,
    input_ids: Tensor,
    response_start: Tensor,
    response_mask: Tensor,
    temperatures: Tensor,
    *,
    with_entropy: bool = True,
    support: Tensor | None = None,
) -> TokenLogprobs:
    """Log-probs of the response tokens under logits / each sample's own temperature, and their entropy.

    logits [N, L, V] (the model's output over input_ids [N, L]); response_start [N] is the column of each
    sample's first response token; response_mask [N, T] marks real response tokens; temperatures [N] are
    the temperatures the samples were drawn with; support [N, T] (None: the whole vocabulary) the tokens each
    position's sampling kept (`support_mask`), over which the log-probs and entropy are then taken. Log-probs
    carry gradients; entropy is a detached statistic of the same distributions the log-probs come from.
    Works in float32 at least (float64 stays float64).
    """
    mask = response_mask.bool()
    num_tokens = mask.size(1)
    compute_dtype = torch.promote_types(logits.dtype, torch.float32)
    selected = response_logits(logits, response_start, num_tokens)
    # Divide by the temperature each sample was drawn with (Colossal-RL used the initial one after annealing).
    scaled = selected / temperatures.to(compute_dtype).reshape(-1, 1, 1)
    targets = response_tokens(input_ids, response_start, num_tokens)
    keep = None if support is None else support_mask(scaled.detach(), targets, support)
    if keep is not None:
        scaled = scaled.masked_fill(~keep, float("-inf"))
    log_normaliser = torch.logsumexp(scaled, dim=-1)
    logprobs = scaled.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - log_normaliser
    entropy = _entropy(scaled.detach(), log_normaliser.detach(), mask) if with_entropy else None
    return TokenLogprobs(torch.where(mask, logprobs, 0.0), entropy)


def _entropy(scaled: Tensor, log_normaliser: Tensor, mask: Tensor) -> Tensor:
    # H = logZ - sum(p * z) on the SAME logits rows as the log-probs (Colossal-RL shifted them by one),
    # a few rows at a time so the probabilities never exist for the whole batch at once.
    with torch.no_grad():
        expected = torch.cat([_expected_logit(chunk) for chunk in scaled.split(ENTROPY_CHUNK_ROWS)])
        return torch.where(mask, log_normaliser - expected, 0.0)


def _expected_logit(chunk: Tensor) -> Tensor:
    probs = torch.softmax(chunk, dim=-1)
    # Tokens banned with -inf logits have p = 0 and contribute nothing (not 0 * -inf = nan).
    return (probs * chunk.masked_fill(probs == 0, 0.0)).sum(-1)
