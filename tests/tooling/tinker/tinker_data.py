"""Data for the official client: next-token data of a token list, and token-level checks of its outputs."""

from __future__ import annotations

from tinker import types

TOKEN = "tml-zerobubble-test-token"
MODEL = "zerobubble/tiny-1m"
DEADLINE = 120  # seconds any one client call may take


def next_token_datum(ids: list[int], **inputs) -> types.Datum:
    """Tinker's layout: input ids[:-1], each position's target the next id; `inputs` are the other loss inputs,
    one value per target (weights default to 1)."""
    targets = ids[1:]
    fields = {"target_tokens": targets, **inputs}
    if not inputs:
        fields["weights"] = [1.0] * len(targets)
    return types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]), loss_fn_inputs=fields)


def target_logprobs(output: types.ForwardBackwardOutput) -> list[list[float]]:
    return [record["logprobs"].tolist() for record in output.loss_fn_outputs]
