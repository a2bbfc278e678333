"""The demo's task (sums like "3+8+6=", answered as \\boxed{17}) as a tinker-cookbook RL environment, read from the
task's JSONL files: a ProblemEnv per sample, groups of them per prompt, a train set shuffled per epoch and a
held-out set that the cookbook's RLTestSetEvaluator plays. The reward is the demo's: 1 when the last \\boxed{}
holds the answer, else 0 (format_coef 0, so a malformed answer costs nothing more than a wrong one)."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import chz
from tinker_cookbook import renderers
from tinker_cookbook.rl.problem_env import ProblemEnv, ProblemGroupBuilder
from tinker_cookbook.rl.types import EnvGroupBuilder, RLDataset, RLDatasetBuilder
from tinker_cookbook.tokenizer_utils import get_tokenizer

BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


def boxed_answer(text: str) -> str | None:
    found = BOXED.findall(text)
    return found[-1].strip() if found else None


class SumEnv(ProblemEnv):
    def __init__(self, question: str, answer: str, renderer: renderers.Renderer):
        super().__init__(renderer, format_coef=0.0)
        self.question = question
        self.answer = answer

    def get_question(self) -> str:
        return self.question

    def check_answer(self, sample_str: str) -> bool:
        return boxed_answer(sample_str) == self.answer

    def check_format(self, sample_str: str) -> bool:
        return boxed_answer(sample_str) is not None

    def get_reference_answer(self) -> str:
        return self.answer


def read_rows(path: str) -> list[tuple[str, str]]:
    """(question, answer) of each row; the task writes `messages` as one object or as a list."""
    rows = []
    for line in Path(path).read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            messages = record["messages"]
            message = messages if isinstance(messages, dict) else messages[-1]
            rows.append((message["content"], str(record["gt_answer"])))
    return rows


class SumsDataset(RLDataset):
    """Batches of `groups_per_batch` prompts over `epochs` passes, each pass in its own seeded order."""

    def __init__(self, rows: list[tuple[str, str]], renderer: renderers.Renderer, groups_per_batch: int,
                 group_size: int, epochs: int, seed: int, name: str):
        order = []
        for epoch in range(epochs):
            shuffled = list(rows)
            random.Random(seed + epoch).shuffle(shuffled)
            order.extend(shuffled)
        self.order = order
        self.renderer = renderer
        self.groups_per_batch = groups_per_batch
        self.group_size = group_size
        self.name = name

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        start = index * self.groups_per_batch
        return [ProblemGroupBuilder(env_thunk=partial(SumEnv, question, answer, self.renderer),
                                    num_envs=self.group_size, dataset_name=self.name)
                for question, answer in self.order[start:start + self.groups_per_batch]]

    def __len__(self) -> int:
        return -(-len(self.order) // self.groups_per_batch)


@chz.chz
class SumsDatasetBuilder(RLDatasetBuilder):
    train_file: str
    test_file: str | None
    model_name_for_tokenizer: str
    renderer_name: str
    groups_per_batch: int
    group_size: int
    # Samples per held-out prompt: pass@1 is the share of them that are right.
    test_group_size: int = 16
    epochs: int = 1
    seed: int = 0

    async def __call__(self) -> tuple[SumsDataset, SumsDataset | None]:
        renderer = renderers.get_renderer(self.renderer_name, tokenizer=get_tokenizer(self.model_name_for_tokenizer))
        train = SumsDataset(read_rows(self.train_file), renderer, self.groups_per_batch, self.group_size,
                            self.epochs, self.seed, "sums")
        if self.test_file is None:
            return train, None
        held_out = read_rows(self.test_file)
        test = SumsDataset(held_out, renderer, len(held_out), self.test_group_size, 1, self.seed, "sums")
        return train, test
