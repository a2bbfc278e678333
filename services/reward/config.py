"""The reward service's configuration schema (all defaults are here)."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from zerobubble.common.config import Schema, ServerConfig, host_port
from zerobubble.common.sandbox.config import SandboxConfig
from zerobubble.common.user_code import refuse_token_in_env

# The verifiers the service always has, and the ground truth each reads.
BUILTIN_GROUND_TRUTH = {"boxed": "gt_answer", "think_answer_tags": "gt_answer", "code": "test_cases"}
REWARD_MODEL = "reward_model"
_NAME = r"[A-Za-z_][\w.-]*"
_FUNCTION = re.compile(r"[A-Za-z_][\w]*(?:\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*")
GroundTruth = Literal["gt_answer", "test_cases", "none"]


class RewardValues(Schema):
    """What a verdict is worth. The reference (Colossal-RL) uses correct=10, wrong=0."""

    correct: float = 1.0
    wrong: float = 0.0


class MathConfig(Schema):
    workers: int = Field(default_factory=lambda: os.cpu_count() or 1, gt=0,
                         description="verification processes (default: one per core)")
    timeout_seconds: float = Field(5.0, gt=0, description="per-item limit; the worker is replaced after it")
    max_consecutive_errors: int = Field(3, gt=0, description="a worker whose custom verifier raised this many "
                                        "times in a row is replaced (a leaked resource dies with it)")
    memory_bytes: int = Field(2 * 1024 ** 3, gt=0, description="address space of each worker (RLIMIT_AS)")
    max_open_files: int = Field(256, gt=16, description="open files of each worker (RLIMIT_NOFILE)")
    env: list[str] = Field(default_factory=list, description="names of the service's environment variables the "
                           "workers get, beside PATH, HOME, LANG, LC_ALL, TZ, TMPDIR and PYTHONPATH; "
                           "nothing else (never the bearer token's variable)")


class LimitsConfig(Schema):
    """Sizes are UTF-8 bytes, as the wire counts them."""

    max_response_bytes: int = Field(256 * 1024, gt=0)
    max_answer_bytes: int = Field(16 * 1024, gt=0, description="the ground-truth answer")
    max_id_bytes: int = Field(1024, gt=0, description="an item's id, which comes back in its result")
    max_test_cases: int = Field(256, gt=0)
    max_test_bytes: int = Field(16 * 1024 * 1024, gt=0, description="all test inputs and outputs of one item")
    max_batch_items: int = Field(4096, gt=0)
    max_pending_items: int = Field(8192, gt=0, description="items accepted but not finished; beyond "
                                   "this new work is refused with RESOURCE_EXHAUSTED")
    max_prompt_bytes: int = Field(256 * 1024, gt=0, description="the prompt an item carries (the reward model "
                                  "reads it)")
    max_metadata_bytes: int = Field(64 * 1024, gt=0, description="an item's metadata, as compact JSON")


class HttpConfig(Schema):
    """HTTP/JSON beside gRPC, for tools that speak only HTTP: it shares the scorer, its limits, the bearer
    token, TLS and the metrics of `server`."""

    listen: str | None = Field(None, description="HOST:PORT of the HTTP endpoints (POST /v1/score, OpenRLHF's "
                               "/get_reward, slime's /reward, GET /healthz); null: no HTTP")
    verifier: str = Field("boxed", description="verifier of /get_reward and /reward when the URL does not name "
                          "one with ?verifier=")
    header_timeout_seconds: float = Field(10.0, gt=0, description="from a connection's opening (or its last "
                                          "response) to a complete request head; past it the connection is closed")
    body_timeout_seconds: float = Field(30.0, gt=0, description="reading a request's body; past it: 408")
    idle_timeout_seconds: float = Field(60.0, gt=0, description="a keep-alive connection with no request is "
                                        "closed after it")
    max_connections: int = Field(256, gt=0, description="connections held at once; a new one beyond it closes "
                                 "the oldest still waiting for its request head, or is itself closed")
    max_connections_per_peer: int = Field(64, gt=0, description="the same bound per client address")
    max_json_digits: int = Field(100, gt=0, description="digits of one number in a JSON body")

    @field_validator("listen")
    @classmethod
    def _host_port(cls, value: str | None) -> str | None:
        # The rule of server.listen, so both listeners take the same addresses.
        return value if value is None else host_port(value)


class CustomVerifierConfig(Schema):
    """A verifier the user brings: `function(response, ground_truth, metadata)` returning a number (the reward)
    or a dict {reward, answer_ok, format_ok, extracted_answer}. It runs in the math worker processes, under
    math.timeout_seconds."""

    name: str = Field(pattern=f"^{_NAME}$", description="what requests name in `verifier`")
    function: str = Field(description="module:callable, imported from PYTHONPATH or `path`")
    ground_truth: GroundTruth = Field("gt_answer", description="what an item must carry and the callable gets: "
                                      "the answer (a string), the test cases ({inputs, outputs}) or none (None)")
    path: Path | None = Field(None, description="a folder put first on sys.path of the workers to import from")
    description: str = ""

    @field_validator("function")
    @classmethod
    def _module_and_name(cls, value: str) -> str:
        if not _FUNCTION.fullmatch(value):
            raise ValueError(f"expected module:callable (e.g. my_rewards:score), got {value!r}")
        return value

    @field_validator("path")
    @classmethod
    def _folder(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_dir():
            raise ValueError(f"{value} is not a folder")
        return value


class RewardModelConfig(Schema):
    """A Hugging Face sequence-classification model with one output, scoring prompt + response as OpenRLHF's
    reward-model server does (serve_rm.py): left padding, no added special tokens, batched."""

    path: Path = Field(description="an HF model folder (config, weights, tokenizer)")
    device: str = Field("cpu", pattern=r"^(auto|cpu|cuda(:\d+)?)$", description="auto: cuda when present, "
                        "else cpu")
    dtype: Literal["fp32", "bf16", "fp16"] = "fp32"
    batch_size: int = Field(8, gt=0, description="items scored in one forward pass at most")
    max_length: int = Field(2048, gt=0, description="tokens of prompt + response; longer ones lose their start, "
                            "so the end of the response, where the score is read, stays")
    answer_threshold: float = Field(0.0, description="a score at or above it counts as answer_ok")
    torch_threads: int | None = Field(None, gt=0, description="CPU threads of the model (null: torch's default)")
    timeout_seconds: float = Field(30.0, gt=0, description="per-item limit, queueing included: an item not scored "
                                   "by then answers `timeout` (a forward pass cannot be interrupted; later items "
                                   "wait for it)")

    @field_validator("path")
    @classmethod
    def _model_folder(cls, value: Path) -> Path:
        if not (value / "config.json").is_file():
            raise ValueError(f"{value} is not a model folder (no config.json)")
        return value


class VerifierPart(Schema):
    verifier: str = Field(description="a built-in, custom or reward_model verifier")
    weight: float

    @field_validator("weight")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("must be a finite number")
        return value


class CombinedVerifierConfig(Schema):
    """reward = sum of weight x part's reward; answer_ok and format_ok hold when they hold for every part."""

    name: str = Field(pattern=f"^{_NAME}$")
    parts: list[VerifierPart] = Field(min_length=1)
    description: str = ""


class RewardServiceConfig(Schema):
    server: ServerConfig = ServerConfig(listen="127.0.0.1:50052")
    rewards: RewardValues = RewardValues()
    math: MathConfig = Field(default_factory=MathConfig)
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    limits: LimitsConfig = LimitsConfig()
    http: HttpConfig = HttpConfig()
    custom_verifiers: list[CustomVerifierConfig] = Field(default_factory=list, description="verifiers the user "
                                                         "brings: [{name, function: module:callable, "
                                                         "ground_truth, path}] (README)")
    reward_model: RewardModelConfig | None = Field(None, description="adds the reward_model verifier; null: none")
    combined_verifiers: list[CombinedVerifierConfig] = Field(default_factory=list, description="weighted sums of "
                                                             "other verifiers: [{name, parts: [{verifier, "
                                                             "weight}]}]")

    @model_validator(mode="after")
    def _rewards_ordered(self) -> RewardServiceConfig:
        if self.rewards.correct < self.rewards.wrong:
            raise ValueError("rewards.correct must not be below rewards.wrong")
        return self

    @model_validator(mode="after")
    def _token_stays_out(self) -> RewardServiceConfig:
        refuse_token_in_env(self.server.auth_token_env, self.math.env, "math.env", "verifiers")
        return self

    @model_validator(mode="after")
    def _verifier_names(self) -> RewardServiceConfig:
        """Names are unique, and every part of a combination names a verifier that is not itself a combination
        and whose ground truth agrees with the other parts' (an item carries one)."""
        ground_truths = self.ground_truths()
        taken = set(BUILTIN_GROUND_TRUTH) | {REWARD_MODEL}
        for kind, entries in (("custom_verifiers", self.custom_verifiers),
                              ("combined_verifiers", self.combined_verifiers)):
            for index, entry in enumerate(entries):
                if entry.name in taken:
                    raise ValueError(f"{kind}[{index}].name: {entry.name!r} is already a verifier's name")
                taken.add(entry.name)
        combined = {entry.name for entry in self.combined_verifiers}
        for index, entry in enumerate(self.combined_verifiers):
            kinds = set()
            for number, part in enumerate(entry.parts):
                field = f"combined_verifiers[{index}].parts[{number}].verifier"
                if part.verifier in combined:
                    raise ValueError(f"{field}: {part.verifier!r} is a combination; parts are single verifiers")
                if part.verifier not in ground_truths:
                    known = ", ".join(sorted(name for name in ground_truths if name not in combined))
                    hint = " (set reward_model to add it)" if part.verifier == REWARD_MODEL else ""
                    raise ValueError(f"{field}: unknown verifier {part.verifier!r}{hint} (known: {known})")
                kinds.add(ground_truths[part.verifier])
            if {"gt_answer", "test_cases"} <= kinds:
                raise ValueError(f"combined_verifiers[{index}].parts: an item carries an answer or test cases, "
                                 "not both: combine verifiers of one kind of ground truth")
        return self

    def ground_truths(self) -> dict[str, str]:
        """Every configured verifier's name -> the ground truth its items carry."""
        found = dict(BUILTIN_GROUND_TRUTH)
        if self.reward_model is not None:
            found[REWARD_MODEL] = "none"
        found.update({entry.name: entry.ground_truth for entry in self.custom_verifiers})
        for entry in self.combined_verifiers:
            kinds = {found.get(part.verifier, "none") for part in entry.parts} - {"none"}
            found[entry.name] = min(kinds, default="none")
        return found
