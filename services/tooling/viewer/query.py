"""The viewer's query strings, typed: an unknown, repeated or malformed parameter is refused naming it."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from zerobubble.v1 import common_pb2

FINISH_REASONS = tuple(name.removeprefix("FINISH_REASON_").lower() for name in common_pb2.FinishReason.keys())
MAX_PAGE = 200


class BadQuery(ValueError):
    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class Query(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @field_validator("*", mode="after")
    @classmethod
    def _finite(cls, value: Any) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError("must be a finite number")
        return value


class RolloutFilter(Query):
    """A page of the rollout log: groups from line `cursor` on that match; response filters keep a group when one
    of its responses passes all of them."""

    cursor: int = Field(0, ge=0, description="the line to scan from")
    limit: int = Field(50, ge=1, le=MAX_PAGE, description="groups in the page at most")
    step_min: int | None = Field(None, ge=0)
    step_max: int | None = Field(None, ge=0)
    source: str | None = Field(None, max_length=200, description="the prompt's data source")
    reward_min: float | None = None
    reward_max: float | None = None
    finish: str | None = Field(None, description=f"one of {', '.join(FINISH_REASONS)}")
    version: int | None = Field(None, ge=0, description="the policy version that generated the response")
    length_min: int | None = Field(None, ge=0)
    length_max: int | None = Field(None, ge=0)

    @field_validator("finish")
    @classmethod
    def _finish(cls, value: str | None) -> str | None:
        if value is not None and value not in FINISH_REASONS:
            raise ValueError(f"must be one of {', '.join(FINISH_REASONS)}")
        return value

    def group_passes(self, row: dict[str, Any]) -> bool:
        step = row.get("step")
        if self.step_min is not None and not (isinstance(step, int) and step >= self.step_min):
            return False
        if self.step_max is not None and not (isinstance(step, int) and step <= self.step_max):
            return False
        if self.source is not None and row.get("data_source") != self.source:
            return False
        responses = row.get("responses")
        return isinstance(responses, list) and any(self._response_passes(r) for r in responses if isinstance(r, dict))

    def _response_passes(self, response: dict[str, Any]) -> bool:
        reward, length = response.get("reward"), response.get("length")
        if self.reward_min is not None and not (_is_number(reward) and reward >= self.reward_min):
            return False
        if self.reward_max is not None and not (_is_number(reward) and reward <= self.reward_max):
            return False
        if self.length_min is not None and not (_is_number(length) and length >= self.length_min):
            return False
        if self.length_max is not None and not (_is_number(length) and length <= self.length_max):
            return False
        if self.version is not None and response.get("policy_version") != self.version:
            return False
        finish = str(response.get("finish_reason", "")).removeprefix("FINISH_REASON_").lower()
        return self.finish is None or finish == self.finish


class GroupQuery(Query):
    line: int = Field(ge=0, description="the group's line in the rollout log, from 0")


class FollowQuery(Query):
    since: int = Field(0, ge=0, description="the byte offset the last answer ended at")


class EvalPairQuery(Query):
    dataset: str = Field(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}$", description="an evaluated data set's name")
    a: int = Field(ge=0, description="the first policy version")
    b: int = Field(ge=0, description="the second policy version")
    limit: int = Field(50, ge=1, le=MAX_PAGE, description="questions at most")


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def parse(model: type[Query], params: Mapping[str, str], keys: list[str]) -> Query:
    """`params` (a query string's, with `keys` every key as sent, repeats included) as `model`."""
    repeated = sorted({key for key in keys if keys.count(key) > 1})
    if repeated:
        raise BadQuery(repeated[0], "given more than once")
    try:
        return model.model_validate(dict(params))
    except ValidationError as exc:
        error = exc.errors()[0]
        field = ".".join(str(part) for part in error["loc"]) or "query"
        message = "unknown parameter" if error["type"] == "extra_forbidden" else error["msg"]
        raise BadQuery(field, message) from None
