"""Turn a leased prompt into the token ids the engine generates from."""

from __future__ import annotations

import json

from zerobubble.common.routing import VerifierRouting
from zerobubble.v1 import common_pb2

# The reference's default system prompt per reward type (Colossal-RL README, "reward types").
SYSTEM_PROMPTS = {
    "boxed": "Please reason step by step, and put your final answer within \\boxed{}.",
    "think_answer_tags": (
        "You are a helpful assistant. The assistant first thinks about the reasoning process in the mind and "
        "then provides the user with the answer. The reasoning process and answer are enclosed within "
        "<think> </think> and<answer> </answer> tags, respectively, i.e., <think> reasoning process here "
        "</think><answer> answer here </answer>. Now the user asks you to solve a math problem that involves "
        "reasoning. After thinking, when you finally reach a conclusion, clearly output the final answer "
        "without explanation within the <answer> </answer> tags, i.e., <answer> 123 </answer>.\n\n"
    ),
    "code": "You are a helpful assistant.",
}


def system_prompt(verifier: str, override: str | None) -> str:
    """The configured system prompt, or the reference's default for the verifier (none for others)."""
    return SYSTEM_PROMPTS.get(verifier, "") if override is None else override


class PromptTooLong(ValueError):
    """Even with its content emptied, the templated prompt does not fit in max_prompt_tokens."""


class NotMessages(ValueError):
    """The prompt is not chat messages as JSON."""


class PromptBuilder:
    """Applies the chat template with the verifier's system prompt, and fits the result into a token budget
    by cutting the start of the last user message's content, so the template (the assistant header
    above all, which the reference cut off) always survives."""

    def __init__(self, tokenizer, system_prompt: str, max_prompt_tokens: int):
        self.tokenizer = tokenizer
        self.system_prompt = system_prompt
        self.max_prompt_tokens = max_prompt_tokens

    def messages(self, messages_json: str) -> list[dict[str, str]]:
        try:
            messages = json.loads(messages_json)
        except RecursionError:
            raise NotMessages("the JSON is nested too deeply") from None
        except json.JSONDecodeError as exc:
            raise NotMessages(f"not JSON ({exc})") from None
        if isinstance(messages, dict):
            messages = [messages]
        # Chat templates index messages freely: anything else fails inside them with no useful message.
        if not isinstance(messages, list) or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in messages):
            raise NotMessages("expected a message or a list of messages, each an object with string 'role' "
                              "and 'content'")
        if self.system_prompt and not any(m["role"] == "system" for m in messages):
            messages = [{"role": "system", "content": self.system_prompt}, *messages]
        return messages

    def render(self, messages: list[dict[str, str]], tools: list[dict] | None = None) -> list[int]:
        text = self.tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False,
                                                  add_generation_prompt=True)
        return self.tokenizer.encode(text, add_special_tokens=False)

    def build(self, messages_json: str) -> list[int]:
        return self.fit(self.messages(messages_json))

    def fit(self, messages: list[dict[str, str]], tools: list[dict] | None = None) -> list[int]:
        """The templated ids of `messages` (and the tools the template lists), within max_prompt_tokens."""
        ids = self.render(messages, tools)
        if len(ids) <= self.max_prompt_tokens:
            return ids
        last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=None)
        if last_user is not None:
            content_ids = self.tokenizer.encode(messages[last_user]["content"], add_special_tokens=False)
            keep = len(content_ids) - (len(ids) - self.max_prompt_tokens)
            # Re-encoding a cut text can merge tokens differently at the seam: shrink until it fits.
            while keep > 0:
                cut = dict(messages[last_user], content=self.tokenizer.decode(content_ids[-keep:]))
                ids = self.render([*messages[:last_user], cut, *messages[last_user + 1:]], tools)
                if len(ids) <= self.max_prompt_tokens:
                    return ids
                keep -= max(1, len(ids) - self.max_prompt_tokens)
        raise PromptTooLong(
            f"more than run_spec.max_prompt_tokens={self.max_prompt_tokens} tokens even without the content of "
            "its last user message (the chat template, the system prompt and any other messages take that alone)"
        )


class RoutedPrompts:
    """Each leased prompt's verifier, chosen by its data source, and its token ids built with that verifier's
    system prompt. `default` is the builder of the default verifier, for prompts that come without a row."""

    def __init__(self, tokenizer, routing: VerifierRouting, override: str | None, max_prompt_tokens: int):
        self.routing = routing
        self._builders = {verifier: PromptBuilder(tokenizer, system_prompt(verifier, override), max_prompt_tokens)
                          for verifier in routing.verifiers()}
        self.default = self._builders[routing.verifier]

    def verifier(self, prompt: common_pb2.Prompt) -> str:
        return self.routing.verifier_for(prompt.data_source if prompt.HasField("data_source") else None)

    def build(self, prompt: common_pb2.Prompt) -> list[int]:
        return self.builder(prompt).build(prompt.messages_json)

    def builder(self, prompt: common_pb2.Prompt) -> PromptBuilder:
        return self._builders[self.verifier(prompt)]
