"""A real teacher service on loopback over the tiny model, the same model with its answers altered, and a student
tokenizer that names ids otherwise."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
from tokenizers import Tokenizer, models
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from zerobubble.common.clients.teacher import TeacherClient
from zerobubble.common.config import ClientConfig, load_config
from zerobubble.common.tokenizer_fingerprint import tokenizer_fingerprint, tokenizer_name
from zerobubble.teacher.app import build
from zerobubble.teacher.config import TeacherModelConfig, TeacherServiceConfig
from zerobubble.teacher.model import TeacherModel

TOKEN = "teacher-test-token"


def start_teacher(model: Path, scorer: Any = None, **overrides: Any):
    settings = {"server.listen": "127.0.0.1:0", "server.metrics_port": None, "server.grace_seconds": 0.5,
                "server.auth_token": TOKEN, "model.path": str(model), **overrides}
    return build(load_config(TeacherServiceConfig, None, settings), scorer=scorer).start()


def student_client(address: str, model: Path, **config: Any) -> TeacherClient:
    tokenizer = AutoTokenizer.from_pretrained(model)
    settings = {"address": address, "auth_token": TOKEN, "timeout_seconds": 10.0, "retry_seconds": 2.0, **config}
    return TeacherClient(ClientConfig(**settings), tokenizer_fingerprint(tokenizer), tokenizer_name(tokenizer, model))


def other_tokenizer(directory: Path) -> Path:
    """A word-level tokenizer of four words: its ids name other tokens than the tiny model's bytes."""
    core = Tokenizer(models.WordLevel({"<unk>": 0, "one": 1, "two": 2, "three": 3}, unk_token="<unk>"))
    PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>").save_pretrained(directory)
    return directory


def call(address: str, method: str, request, token: str | None = TOKEN, timeout: float = 10.0):
    """One raw call on the teacher's stub, as any gRPC client would make it."""
    from zerobubble.v1 import teacher_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        metadata = (("authorization", f"Bearer {token}"),) if token else ()
        return getattr(teacher_pb2_grpc.TeacherServiceStub(channel), method)(request, timeout=timeout,
                                                                              metadata=metadata)


class Altered:
    """The real tiny model, its answers changed by `alter` after the forward pass."""

    def __init__(self, path, alter):
        self.model = TeacherModel(TeacherModelConfig(path=path))
        self.alter = alter

    def __getattr__(self, name):
        return getattr(self.model, name)

    def logprobs(self, sequences):
        return self.alter(self.model.logprobs(sequences))
