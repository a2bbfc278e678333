"""Warm-start transcripts of a tool call: the model writes the call, reads the tool's answer, and boxes it.

A fraction of the warm start's examples are these episodes (the rest answer directly), so the warm-started model
sometimes calls the tool and mostly does not: the headroom reinforcement learning closes on a task the model
cannot do alone. The transcripts are tokenised exactly as the rollout worker plays episodes (the model's turns as
tokens, the tool's answer rendered between them by the chat template), and only the model's turns are targets.
"""

from __future__ import annotations

from dataclasses import dataclass

from zerobubble.rollout.episodes.render import TurnRenderer
from zerobubble.tooling.tiny.task import TaskRow, target_response


@dataclass(frozen=True)
class ToolCallShape:
    call: str               # how the model writes the call; {expression} is the question without its "="
    tool_name: str          # the name the tool's answer is rendered under

    def call_text(self, row: TaskRow) -> str:
        return self.call.format(expression=row.messages[-1]["content"].rstrip().rstrip("="))


def tool_episode(tokenizer, renderer: TurnRenderer, row: TaskRow, shape: ToolCallShape) -> tuple[list[int], list[int]]:
    """The response ids of one tool-using episode and its target mask (1: the model's tokens)."""
    eos = tokenizer.eos_token_id
    call = [*tokenizer.encode(shape.call_text(row), add_special_tokens=False), eos]
    answer = [*tokenizer.encode(target_response(row.gt_answer), add_special_tokens=False), eos]
    observation = renderer.observation_tokens(
        [{"role": "tool", "name": shape.tool_name, "content": row.gt_answer}], ended_with_eos=True)
    return [*call, *observation, *answer], [1] * len(call) + [0] * len(observation) + [1] * len(answer)
