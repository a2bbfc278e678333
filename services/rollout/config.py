"""The rollout service's configuration schema (all defaults are here)."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from zerobubble.common.config import ClientConfig, Schema, ServerConfig
from zerobubble.common.data_spec import DataSpec
from zerobubble.common.run_spec import RunSpec


def _default_worker_id() -> str:
    return f"rollout-{socket.gethostname()}-{os.getpid()}"


class ModelConfig(Schema):
    path: Path = Field(description="an HF-format model folder (config, weights, tokenizer with a chat template)")
    engine: Literal["transformers", "vllm"] = "transformers"
    device: str = Field("auto", description="auto (cuda when present, else cpu), cpu, cuda, cuda:N")
    dtype: Literal["auto", "bf16", "fp32"] = Field("auto", description="auto: bf16 on GPUs that have it, else fp32")


class GenerationConfig(Schema):
    """What this worker alone decides. The group size, the token limits and the temperature schedule are the run
    spec's (the buffer's); a value set here is only an expectation, and the worker refuses to start on a mismatch."""

    num_generations: int | None = Field(None, gt=0, description="expected run_spec.num_generations (null: the spec's)")
    prompts_per_batch: int = Field(8, gt=0, description="prompts leased and generated together")
    batches_in_flight: int = Field(
        1, ge=1, le=8, description="episodes played in loops (the transformers engine): batches leased and played at "
        "once, the next started while the last one's slowest episodes play; more than 1 needs run.weight_updates "
        "between_turns or in_flight")
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(-1, description="-1 turns it off")
    max_new_tokens: int | None = Field(None, gt=0, description="expected run_spec.max_new_tokens (null: the spec's)")
    max_prompt_tokens: int | None = Field(None, gt=0, description="expected run_spec.max_prompt_tokens (null: the "
                                          "spec's)")
    stop: list[str] = Field(default_factory=list)
    seed: int = 0
    prefix_on_new_weights: Literal["keep", "recompute"] = Field(
        "keep", description="run.weight_updates in_flight: after new weights mid-sequence, keep the KV cache the old "
        "weights computed for the tokens so far (cheap; later tokens attend to old keys and values) or recompute it "
        "with the new weights (one prefill of the sequence so far; each token's log-prob is then exactly its "
        "version's)")

    def truncation_field(self) -> str | None:
        """The setting that truncates the sampled distribution (top_k before top_p), if any: the trainer can only
        replay a support the engine recorded."""
        if self.top_k > 0:
            return "generation.top_k"
        return "generation.top_p" if self.top_p < 1.0 else None

    def expectations(self) -> dict[str, tuple[str, object]]:
        """What this section states of the run spec, by spec field."""
        return {name: (f"generation.{name}", getattr(self, name))
                for name in ("num_generations", "max_new_tokens", "max_prompt_tokens")}


class RequestLimits(Schema):
    """Bounds on one Generate call, checked before anything of it is tokenized or generated. In tokens, a raw
    prompt must fit in the run spec's max_prompt_tokens, and a chat prompt is cut to it as the worker's own are."""

    max_samples: int | None = Field(None, gt=0, description="Generate: n x prompts, so also n and the number of "
                                    "prompts (null: the worker's own batch, num_generations x prompts_per_batch)")
    max_new_tokens: int | None = Field(None, gt=0, description="Generate: null: run_spec.max_new_tokens")
    max_prompt_bytes: int = Field(64 * 1024, gt=0, description="Generate: UTF-8 bytes of one prompt as sent")
    max_stop_strings: int = Field(8, ge=0, description="Generate: stop strings of one call")
    max_stop_bytes: int = Field(256, gt=0, description="Generate: UTF-8 bytes of one stop string")
    max_calls: int = Field(4, gt=0, description="Generate calls generating or waiting for the engine at once; "
                           "more are refused with RESOURCE_EXHAUSTED")


class RewardConfig(Schema):
    verifier: str | None = Field(None, description="expected run_spec.verifier, the default verifier (null: the "
                                 "spec's)")
    system_prompt: str | None = Field(None, description="default: the reference's prompt for each row's verifier "
                                      "(none for verifiers the reward service's config adds)")
    partial_credit: bool = Field(False, description="code: reward the fraction of tests passed")


class EvalConfig(Schema):
    datasets: dict[str, DataSpec] = Field(default_factory=dict, description="name -> a data set as the buffer's "
                                          "prompts take it (a path, or {path, split, columns, skip_bad_rows})")
    interval: int = Field(0, ge=0, description="evaluate every this many policy versions (0: never)")
    at_start: bool = Field(True, description="also evaluate the starting weights")
    samples_per_prompt: int = Field(4, gt=0, description="n: pass@1 is the mean over them, pass@k uses all")
    prompts_per_call: int = Field(32, gt=0, description="prompts generated together: the evaluation reports its "
                                  "progress (eval/progress.json, the log) after each call")
    temperature: float = Field(1.0, ge=0)
    max_prompts: int | None = Field(None, gt=0, description="evaluate only the first N prompts of each set")
    output_dir: Path = Field(Path("eval"), description="a JSONL of results per version and a summary.jsonl")


class OpenAIEndpointConfig(Schema):
    """An OpenAI-compatible endpoint on the worker (rollout/openai_endpoint.py), behind the service's token."""

    enabled: bool = Field(False, description="serve /v1/chat/completions and /v1/models (docs: Agents and "
                          "environments from other tools)")
    listen: str = Field("127.0.0.1:0", pattern=r"^[^\s:]+:\d+$", description="host:port of the HTTP endpoint")
    model_name: str = Field("zerobubble-policy", description="the model id /v1/models lists")
    max_sessions: int = Field(64, gt=0, description="sessions open at once; more are refused with 429")
    max_calls_per_session: int = Field(32, gt=0)
    session_idle_s: float = Field(600.0, gt=0, description="a session with no call for this long is dropped")
    max_body_bytes: int = Field(1024 * 1024, gt=0)
    io_timeout_s: float = Field(10.0, gt=0, description="a request's head and body arrive whole within this (a slow "
                                "sender gets 408 and is cut)")
    group_ground_truth: bool = Field(True, description="POST /v1/groups answers the row with its ground_truth, for "
                                     "an agent that scores its own sessions (false: hidden)")
    exclusive: bool = Field(False, description="the worker leases and generates nothing itself: prompts reach the "
                            "model only as the endpoint's groups (POST /v1/groups), as when an outside agent trains")

    @model_validator(mode="after")
    def _exclusive_needs_enabled(self) -> OpenAIEndpointConfig:
        if self.exclusive and not self.enabled:
            # The worker would wait forever for groups that nothing can lease.
            raise ValueError("openai.exclusive needs openai.enabled: true (else nothing would generate)")
        return self


class RolloutServiceConfig(Schema):
    server: ServerConfig = ServerConfig(listen="127.0.0.1:50054")
    worker_id: str = Field(default_factory=_default_worker_id, description="unique per running worker")
    model: ModelConfig
    generation: GenerationConfig = GenerationConfig()
    requests: RequestLimits = RequestLimits()
    reward: RewardConfig = RewardConfig()
    eval: EvalConfig = EvalConfig()
    buffer: ClientConfig = ClientConfig(address="127.0.0.1:50053")
    reward_service: ClientConfig = ClientConfig(address="127.0.0.1:50052", timeout_seconds=300.0)
    trainer: ClientConfig | None = Field(
        ClientConfig(address="127.0.0.1:50055"),
        description="where new weights come from (JoinWeightSync); null: keep the starting weights",
    )
    environment: ClientConfig | None = Field(
        None, description="the environment service that hosts the environments of run_spec.episodes (null: the run "
        "has no episodes; a run with episodes refuses to start without it)")
    openai: OpenAIEndpointConfig = Field(default_factory=OpenAIEndpointConfig, description="an OpenAI-compatible "
                                         "endpoint that records the token ids of an agent's calls (off by default)")
    torch_threads: int | None = Field(None, gt=0, description="CPU threads of torch in this process (null: "
                                      "torch's default, all cores); on a shared small machine 1 avoids contention")
    failure_log: Path | None = Field(
        None, description="a JSONL file where the worker also writes what it logs of failing environments (the "
        "first error of each kind per environment, batches whose episodes all failed, a stop); `zerobubble up` "
        "sets it and shows it on its console")
    backoff_max_seconds: float = Field(5.0, gt=0, description="longest pause between retries of a lost peer")
    lease_wait_seconds: float = Field(0.5, gt=0, description="pause before asking again after an empty lease")

    def generate_limits(self, spec: RunSpec) -> RequestLimits:
        """The Generate call's bounds, the unset ones being the worker's own batch under the run spec."""
        return self.requests.model_copy(update={
            "max_samples": self.requests.max_samples or spec.num_generations * self.generation.prompts_per_batch,
            "max_new_tokens": self.requests.max_new_tokens or spec.max_new_tokens,
        })

    def expectations(self) -> dict[str, tuple[str, object]]:
        """What this config states of the run spec, by spec field (checked against the buffer's at start)."""
        return {**self.generation.expectations(), "verifier": ("reward.verifier", self.reward.verifier)}

    @model_validator(mode="after")
    def _truncation_needs_replay(self) -> RolloutServiceConfig:
        # The trainer replays the sampling support the engine records; vLLM records none, so its truncated
        # log-probs would bias every importance weight by the log of the kept mass.
        field = self.generation.truncation_field()
        if self.model.engine == "vllm" and field:
            raise ValueError(f"{field}: the vllm engine does not record the sampling support the trainer replays; "
                             "use the transformers engine, or top_p 1 and top_k -1")
        return self

    @model_validator(mode="after")
    def _eval_needs_interval(self) -> RolloutServiceConfig:
        if self.eval.datasets and self.eval.interval == 0 and not self.eval.at_start:
            raise ValueError("eval.datasets is set but neither eval.interval nor eval.at_start asks for an eval")
        return self
