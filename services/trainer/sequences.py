"""How a micro-batch of samples (each one flat sequence, trainer/collate.py) goes through the model to give its
response log-probs: packed end to end once, or padded, and the log-probs read from the last hidden states a chunk
of positions at a time, or from full logits.

- packed: every sample's prompt + response, without padding, one after another in rows as long as the longest
  sample, position ids restarting at each sample; transformers keeps attention inside each sample when the
  attention implementation builds its mask from position ids (sdpa, eager, flex) or reads them as
  variable-length boundaries (flash).
- padded: the micro-batch's samples in rows of their own, each prompt left-padded to the longest prompt and each
  response right-padded to the longest response (the full-logits forward pads to the batch's longest response).
- chunked log-probs: the model's output projection is replaced, for the one forward call, by a function that
  takes the hidden states of the positions that predict response tokens only, and computes their log-probs and
  entropy in chunks (trainer/algorithms/head_logprobs.py). It runs inside the model's forward, so whatever the
  strategy hooks around that forward (autocast, FSDP's gathering of the weights) applies to it as to the head.
- full logits: the model's own logits for every position, as the trainer computed them before (kept for output
  projections that are not one plain linear layer: a bias, a LoRA adapter on the head).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from zerobubble.trainer.algorithms.head_logprobs import chunked_token_logprobs
from zerobubble.trainer.algorithms.logprobs import TokenLogprobs, token_logprobs_and_entropy
from zerobubble.trainer.collate import ExperienceBatch
from zerobubble.trainer.micro_batches import by_token_budget

log = logging.getLogger(__name__)

# Attention implementations of transformers that keep packed sequences apart given restarting position ids and no
# attention mask: those whose mask is built by transformers' masking_utils (which finds the sequence boundaries
# in the position ids), and flash attention (which turns them into variable-length boundaries).
PACKING_ATTENTION = ("sdpa", "eager", "flex_attention", "flash_attention_2", "flash_attention_3")


@dataclass(frozen=True)
class Layout:
    """How one model's forward runs: chunk = positions per chunk of the output projection (None: full logits)."""

    chunk: int | None
    packed: bool


def output_projection(model: nn.Module) -> nn.Linear | None:
    """The model's output projection when it is one plain linear layer without bias (what the chunked log-probs
    compute), else None."""
    for module in model.modules():
        get = getattr(module, "get_output_embeddings", None)
        if callable(get):
            head = get()
            if isinstance(head, nn.Linear):
                return head if head.bias is None else None
            return None
    return None


def _attention_implementation(model: nn.Module) -> str | None:
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "_attn_implementation"):
            return config._attn_implementation
    return None


def choose_layout(model: nn.Module, *, chunk: int | None, packing: bool, what: str) -> Layout:
    """The layout `model` can run, saying once in the log what was asked and cannot be done."""
    if chunk is not None and output_projection(model) is None:
        log.warning("%s: the output projection is not one linear layer without bias; log-probs come from the full "
                    "logits, and sequences are padded", what)
        return Layout(chunk=None, packed=False)
    if chunk is None:
        if packing:
            log.warning("%s: packing needs the chunked log-probs (batch.logprob_chunk_tokens); sequences are padded",
                        what)
        return Layout(chunk=None, packed=False)
    implementation = _attention_implementation(model)
    if packing and implementation not in PACKING_ATTENTION:
        log.warning("%s: attention implementation %r does not keep packed sequences apart; sequences are padded",
                    what, implementation)
        packing = False
    return Layout(chunk=chunk, packed=packing)


@dataclass(frozen=True)
class _ModelInputs:
    input_ids: Tensor          # [B, L]
    position_ids: Tensor       # [B, L]
    attention_mask: Tensor | None
    predicting: Tensor         # [M]: flat index into [B * L] of the position predicting each counted token
    sample: Tensor             # [M]: the sample of each counted token
    column: Tensor             # [M]: its column in the [n, T] response tensors


def _counted(batch: ExperienceBatch) -> tuple[Tensor, Tensor]:
    # The response mask alone says which positions count; log-probs are computed for those only.
    sample, column = torch.nonzero(batch.response_mask > 0, as_tuple=True)
    return sample, column


def _packed(batch: ExperienceBatch) -> _ModelInputs:
    lengths = batch.sequence_lengths
    # Rows as long as the longest sample: one row of everything would make attention, whose mask spans the whole
    # row, cost the square of the micro-batch's tokens; rows of the longest never cost more than padding would.
    rows = by_token_budget(lengths, int(lengths.max()), padded=False)
    width = max(int(lengths[row].sum()) for row in rows)
    input_ids = torch.zeros((len(rows), width), dtype=torch.long)
    position_ids = torch.zeros((len(rows), width), dtype=torch.long)
    starts = torch.zeros(batch.size, dtype=torch.long)
    for r, row in enumerate(rows):
        offset = 0
        for i in row:
            n = int(lengths[i])
            input_ids[r, offset : offset + n] = batch.sequences[i]
            position_ids[r, offset : offset + n] = torch.arange(n)
            starts[i] = r * width + offset
            offset += n
        # The row's unused end is a sequence of its own, which nothing reads and no sample attends to.
        position_ids[r, offset:] = torch.arange(width - offset)
    sample, column = _counted(batch)
    predicting = starts[sample] + batch.prompt_lengths[sample] + column - 1
    return _ModelInputs(input_ids, position_ids, None, predicting, sample, column)


def padded_inputs(batch: ExperienceBatch, response_width: int) -> tuple[Tensor, Tensor, Tensor, int]:
    """Rows of input ids, attention mask and position ids [n, P + response_width], each prompt left-padded to the
    longest prompt P so that every response starts in column P (which is returned)."""
    width = int(batch.prompt_lengths.max())
    input_ids = torch.full((batch.size, width + response_width), batch.pad_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for i, (sequence, prompt) in enumerate(zip(batch.sequences, batch.prompt_lengths.tolist(), strict=True)):
        input_ids[i, width - prompt : width - prompt + len(sequence)] = sequence
        attention_mask[i, width - prompt : width - prompt + len(sequence)] = 1
    return input_ids, attention_mask, (attention_mask.cumsum(dim=1) - 1).clamp(min=0), width


def _padded(batch: ExperienceBatch) -> _ModelInputs:
    input_ids, attention_mask, position_ids, prompt_width = padded_inputs(
        batch, int((batch.sequence_lengths - batch.prompt_lengths).max()))
    sample, column = _counted(batch)
    predicting = sample * input_ids.size(1) + prompt_width + column - 1
    return _ModelInputs(input_ids, position_ids, attention_mask, predicting, sample, column)


@contextlib.contextmanager
def _projection_replaced(head: nn.Linear, compute) -> Iterator[None]:
    # An instance attribute shadows the class's forward for this one call; the module and its weight stay as they
    # are (names, sharding, hooks), so checkpoints and the weight sync see nothing of it.
    head.forward = lambda hidden: compute(hidden, head.weight)
    try:
        yield
    finally:
        del head.forward


def forward_logprobs(model: nn.Module, batch: ExperienceBatch, *, with_entropy: bool,
                     layout: Layout) -> TokenLogprobs:
    """Log-probs of the response tokens at each sample's own sampling temperature, over the support its sampling
    kept (batch.support), and their entropy, [n, T] with zeros where the response mask is zero."""
    device = next(model.parameters()).device
    # A greedy sample (temperature 0) was drawn from the raw distribution.
    temperatures = torch.where(batch.temperatures > 0, batch.temperatures, 1.0)
    if layout.chunk is None:
        input_ids, attention_mask, position_ids, prompt_width = padded_inputs(batch, batch.response_mask.size(1))
        input_ids = input_ids.to(device)
        logits = model(input_ids=input_ids, attention_mask=attention_mask.to(device),
                       position_ids=position_ids.to(device)).logits
        start = torch.full((batch.size,), prompt_width, device=device)
        return token_logprobs_and_entropy(logits, input_ids, start,
                                          batch.response_mask.to(device), temperatures.to(device),
                                          with_entropy=with_entropy,
                                          support=None if batch.support is None else batch.support.to(device))
    inputs = _packed(batch) if layout.packed else _padded(batch)
    predicting = inputs.predicting.to(device)
    targets = inputs.input_ids.reshape(-1).to(device)[predicting + 1]
    token_temperatures = temperatures[inputs.sample].to(device)
    token_support = None if batch.support is None else batch.support[inputs.sample, inputs.column].to(device)
    entropy_box: list[Tensor | None] = []

    def compute(hidden: Tensor, weight: Tensor) -> Tensor:
        flat = hidden.reshape(-1, hidden.size(-1))
        logprobs, entropy = chunked_token_logprobs(flat.index_select(0, predicting), weight, targets,
                                                   token_temperatures, chunk=layout.chunk, with_entropy=with_entropy,
                                                   support=token_support)
        entropy_box.append(entropy)
        # Returned in place of the logits, so the log-probs are the model's output (which strategies hook).
        return logprobs.new_zeros(flat.size(0)).index_put((predicting,), logprobs).view(*hidden.shape[:-1], 1)

    with _projection_replaced(output_projection(model), compute):
        # No cache: transformers looks for packed sequences in the position ids only when there is none.
        out = model(input_ids=inputs.input_ids.to(device), position_ids=inputs.position_ids.to(device),
                    attention_mask=None if inputs.attention_mask is None else inputs.attention_mask.to(device),
                    use_cache=False)
    logprobs = out.logits.reshape(-1)[predicting]
    where = (inputs.sample.to(device), inputs.column.to(device))
    shape = batch.response_mask.shape
    result = logprobs.new_zeros(shape).index_put(where, logprobs)
    entropy = entropy_box[0]
    return TokenLogprobs(result, None if entropy is None else entropy.new_zeros(shape).index_put(where, entropy))
