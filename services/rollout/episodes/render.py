"""The tokens between an episode's turns, rendered by the model's own chat template.

The model's sampled tokens are never re-tokenised: a turn's ids go into the response as sampled, and only the
environment's messages are rendered, as the template would place them after an assistant message. That is the
difference between rendering a fixed conversation with and without them (what verl's and SkyRL's agent loops do),
so whatever a template writes around messages (role headers, end-of-turn markers, a generation prompt) is kept.
"""

from __future__ import annotations

from typing import Any

# Stands in for an assistant turn's content so the template's text around it can be found.
_MARKER = "Zq7xK"
_PROBE = [{"role": "user", "content": "u"}, {"role": "assistant", "content": _MARKER}]


class TemplateNotIncremental(ValueError):
    """The chat template renders a conversation so that a longer one does not start with a shorter one's text:
    observations cannot be appended as tokens."""


def observation_messages(observation: str | list[dict] | None) -> list[dict[str, Any]]:
    """A plain-text observation is the environment speaking as the user (as OpenRLHF's and verl's interactions
    feed it back); a list is already messages."""
    if observation is None:
        return []
    if isinstance(observation, str):
        return [{"role": "user", "content": observation}]
    return list(observation)


class TurnRenderer:
    def __init__(self, tokenizer, max_observation_tokens: int):
        self.tokenizer = tokenizer
        self.max_observation_tokens = max_observation_tokens
        base = self._text(_PROBE, generation_prompt=False)
        # What the template writes after an assistant's content: e.g. "<|im_end|>\n" for ChatML.
        self._after_turn = base[base.rindex(_MARKER) + len(_MARKER):]
        self._base = base
        eos = tokenizer.eos_token or ""
        # When the model ended its turn with its end-of-sequence token, that token is already in the response.
        self._after_eos = self._after_turn[len(eos):] if eos and self._after_turn.startswith(eos) else None
        self.observation_tokens([{"role": "user", "content": "probe"}], ended_with_eos=True)

    def _text(self, messages: list[dict], *, generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)

    def _cut(self, message: dict[str, Any]) -> dict[str, Any]:
        content = message.get("content")
        if not isinstance(content, str):
            return message
        ids = self.tokenizer.encode(content, add_special_tokens=False)
        if len(ids) <= self.max_observation_tokens:
            return message
        return {**message, "content": self.tokenizer.decode(ids[:self.max_observation_tokens])}

    def observation_tokens(self, messages: list[dict[str, Any]], *, ended_with_eos: bool) -> list[int]:
        """The ids to append after an assistant turn so the model's next turn follows `messages`: the end of
        the turn the model did not write itself, the messages (each content cut to max_observation_tokens), and
        the generation prompt of the next assistant turn."""
        messages = [self._cut(m) for m in messages]
        full = self._text([*_PROBE, *messages], generation_prompt=True)
        if not full.startswith(self._base):
            raise TemplateNotIncremental(
                "the model's chat template does not render a conversation as a prefix of a longer one, so "
                "observations cannot be appended between turns")
        before = self._after_eos if ended_with_eos and self._after_eos is not None else self._after_turn
        return self.tokenizer.encode(before + full[len(self._base):], add_special_tokens=False)

    def ends_with_eos(self, token_ids) -> bool:
        return len(token_ids) > 0 and int(token_ids[-1]) == self.tokenizer.eos_token_id
