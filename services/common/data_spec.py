"""Where a prompt data set is and how its rows are read: the schema the services' configs embed, apart from the
reading itself (common/data.py), so that checking a config loads neither numpy nor pyarrow."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from zerobubble.common.config import Schema

# Recognised keys, in order of preference: the first one a row has (and is not null) is used.
PROMPT_KEYS = ("messages", "prompt", "context_messages", "problem")
ANSWER_KEYS = ("gt_answer", "reward_model.ground_truth", "answer", "solution")
TEST_CASES_KEYS = ("test_cases",)
DATA_SOURCE_KEYS = ("data_source", "datasource")



class Columns(Schema):
    """Where a row's fields are. Unset keys are recognised by their names; nested fields are named with dots."""

    prompt_key: str | None = Field(None, description="the prompt: chat messages (a list of {role, content}, or "
                                   "one) or a string taken as the user's message; null: the first of "
                                   + ", ".join(PROMPT_KEYS) + " that the row has")
    answer_key: str | None = Field(None, description="a math row's ground truth (a string or a number); null: "
                                   + ", ".join(ANSWER_KEYS))
    test_cases_key: str | None = Field(None, description="a code row's tests, {inputs: [...], outputs: [...]} or "
                                       "that object as a JSON string; null: test_cases")
    data_source_key: str | None = Field(None, description="which data set a row comes from (evaluations report "
                                        "pass@1 per source); null: " + ", ".join(DATA_SOURCE_KEYS))
    system_prompt: str | None = Field(None, description="put before the prompt's messages when they have no "
                                      "system message (else the rollout's verifier prompt goes there)")


class DataSpec(Schema):
    """One data set: where it is and how its rows are read. A bare path stands for {path: PATH}."""

    path: Path = Field(description="JSONL, JSON (an array of rows), parquet, or a local Hugging Face datasets folder "
                       "(save_to_disk's, or data files load_dataset reads); hub ids need a download first")
    split: str | None = Field(None, description="the split of a folder that has several; null: its only one, or "
                              "train for training prompts and test for evaluation sets")
    columns: Columns = Columns()
    skip_bad_rows: bool = Field(False, description="leave out rows that cannot be used, reporting them in the log, "
                                "instead of refusing the whole set")

    @model_validator(mode="before")
    @classmethod
    def _bare_path(cls, value: Any) -> Any:
        return {"path": value} if isinstance(value, str | Path) else value
