"""The teacher service's configuration schema (all defaults are here)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from zerobubble.common.config import Schema, ServerConfig


class TeacherModelConfig(Schema):
    path: Path = Field(description="the frozen teacher: an HF-format causal LM folder; its tokenizer must "
                      "name every id as the student's does")
    dtype: Literal["fp32", "bf16", "fp16"] = "fp32"
    device: str = Field("auto", description="cuda when there is one, else cpu; or a torch device such as cuda:1")
    torch_threads: int | None = Field(None, gt=0, description="CPU threads of torch in this process (null: torch's "
                                      "default)")


class TeacherLimits(Schema):
    """Bounds of one request, checked before any forward pass; each refusal names the field and the setting."""

    max_sequences: int = Field(64, gt=0, description="sequences in one Logprobs request")
    max_tokens_per_request: int = Field(65536, gt=0, description="token ids over all sequences of one request")
    max_sequence_tokens: int | None = Field(None, gt=1, description="the longest sequence (null: the model's "
                                            "max_position_embeddings)")
    batch_tokens: int = Field(8192, gt=0, description="padded tokens of one forward pass: a request's sequences go "
                              "through the model in batches of at most this many (a longer sequence goes alone)")
    max_waiting_requests: int = Field(16, gt=0, description="requests queued behind the one on the model; more are "
                                      "refused with RESOURCE_EXHAUSTED (the caller retries)")


class TeacherServiceConfig(Schema):
    server: ServerConfig = ServerConfig(listen="127.0.0.1:50058")
    model: TeacherModelConfig
    limits: TeacherLimits = TeacherLimits()
