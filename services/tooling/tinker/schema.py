"""The JSON requests the front reads, with only the fields it uses; the client's other fields (`type`, metadata)
pass unread. A request that fails validation is a 422 naming its first bad field."""

from __future__ import annotations

import json
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from zerobubble.tooling.tinker.errors import invalid


class Request(BaseModel):
    model_config = ConfigDict(extra="ignore", protected_namespaces=())


class CreateSession(Request):
    sdk_version: str = ""


class SessionRef(Request):
    session_id: str


class Lora(Request):
    rank: int = Field(gt=0)
    seed: int | None = None
    train_mlp: bool = True
    train_attn: bool = True
    train_unembed: bool = True


class CreateModel(Request):
    session_id: str
    model_seq_id: int = Field(ge=0)
    base_model: str
    lora_config: Lora | None = None


class ModelRef(Request):
    model_id: str


class AdamParams(Request):
    learning_rate: float = Field(1e-4, ge=0)
    beta1: float = Field(0.9, ge=0, lt=1)
    beta2: float = Field(0.95, ge=0, lt=1)
    eps: float = Field(1e-12, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    grad_clip_norm: float = Field(0.0, ge=0)


class OptimStep(Request):
    model_id: str
    adam_params: AdamParams


class SaveForSampler(Request):
    model_id: str
    path: str | None = Field(None, min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._\-]+$")
    sampling_session_seq_id: int | None = Field(None, ge=0)


class SaveState(Request):
    model_id: str
    path: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._\-]+$")


class LoadState(Request):
    path: str
    optimizer: bool = False
    model_id: str | None = None           # load into this client
    session_id: str | None = None         # or make a new client, of the ServiceClient with this id, from it
    model_seq_id: int | None = Field(None, ge=0)
    base_model: str | None = None


class CreateSamplingSession(Request):
    session_id: str
    sampling_session_seq_id: int = Field(ge=0)
    base_model: str | None = None
    model_path: str | None = None


class EncodedText(Request):
    type: str = "encoded_text"
    tokens: list[int] = Field(max_length=1 << 20)


class ModelInput(Request):
    chunks: list[EncodedText]


class SamplingParams(Request):
    max_tokens: int | None = Field(None, gt=0)
    seed: int | None = None
    stop: str | list[str] | list[int] | None = None
    temperature: float = Field(1.0, ge=0)
    top_k: int = Field(-1, ge=-1)
    top_p: float = Field(1.0, gt=0, le=1)


class Sample(Request):
    sampling_session_id: str | None = None
    base_model: str | None = None
    model_path: str | None = None
    num_samples: int = Field(1, gt=0)
    prompt: ModelInput
    sampling_params: SamplingParams
    prompt_logprobs: bool | None = None
    topk_prompt_logprobs: int = Field(0, ge=0, le=0)
    topk_sample_logprobs: int = Field(0, ge=0, le=0)
    prompt_alt_tokens_k: int = Field(0, ge=0, le=0)


class RetrieveFuture(Request):
    request_id: str


R = TypeVar("R", bound=Request)


def parse(model: type[R], body: bytes) -> R:
    try:
        data = json.loads(body or b"{}", parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise invalid("body", f"not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise invalid("body", "must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = ".".join(str(part) for part in error["loc"]) or "body"
        raise invalid(field, error["msg"]) from None


def _no_constant(name: str) -> float:
    # NaN and Infinity are not JSON: a number that is not finite names no learning rate or temperature.
    raise ValueError(f"{name} is not a JSON number")
