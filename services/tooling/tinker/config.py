"""The Tinker front's settings, typed and validated: where it listens, which model it serves under which name, the
bearer token callers send as their API key, and the bounds on every request and tenant."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator

from zerobubble.common.config import BearerToken, Schema, host_port


class TinkerServerConfig(Schema):
    listen: str = Field("127.0.0.1:8040", description="HOST:PORT the API listens on")
    model_name: str = Field(description="the base model's name as clients ask for it (base_model)")
    model_dir: Path = Field(description="the base model's Hugging Face folder (weights and tokenizer)")
    auth: BearerToken = Field(default_factory=BearerToken, description="the token clients send as their API key "
                              "(X-API-Key, or Authorization: Bearer); the official client wants it to start "
                              "with 'tml-'")
    allowed_hosts: list[str] = Field(default_factory=list, description="Host names besides the loopback ones and "
                                     "the listen address that callers may use ('*': any)")
    max_body_bytes: int = Field(16 << 20, gt=0, description="largest request body; larger ones get 413")
    request_deadline_s: float = Field(30.0, gt=0, description="a request must arrive whole within this")
    poll_wait_s: float = Field(20.0, gt=0, lt=45, description="how long retrieve_future holds a poll open before "
                               "answering try_again (the client waits 45 s for an answer)")
    max_models: int = Field(8, gt=0, description="LoRA training clients held at once, all sessions together")
    max_models_per_session: int = Field(4, gt=0, description="LoRA training clients one session may hold")
    session_timeout_s: float = Field(300.0, gt=0, description="a session not heard from this long ends: its "
                                     "training clients are unloaded (the client heartbeats every 10 s)")
    max_pending_per_session: int = Field(64, gt=0, description="requests of one session queued or running at "
                                         "once; more get 429, which the client retries")
    max_finished: int = Field(4096, gt=0, description="finished results kept for retrieval; the oldest go first")
    max_sampler_weights: int = Field(64, gt=0, description="weights saved for samplers kept at once; the oldest "
                                     "go first (a sampling client already made keeps its own)")
    max_saved_states: int = Field(64, gt=0, description="training states (adapter and Adam state) saved with "
                                  "save_state kept at once, in memory; the oldest go first")
    max_samplers: int = Field(64, gt=0, description="sampling clients held at once, all sessions together; the "
                              "oldest go first")
    max_lora_rank: int = Field(128, gt=0, description="largest LoRA rank a training client may ask for")
    lora_alpha: float = Field(32.0, gt=0, description="the adapters' output is scaled by lora_alpha / rank")
    max_tokens_per_request: int = Field(65536, gt=0, description="tokens of all data of one forward_backward")
    max_new_tokens: int = Field(1024, gt=0, description="largest sampling_params.max_tokens")
    default_max_new_tokens: int = Field(128, gt=0, description="max_tokens when a sample request sets none")
    max_samples_per_request: int = Field(64, gt=0, description="largest num_samples of one sample request, and "
                                         "of the waiting requests sampled together in one batch")
    seed: int = Field(0, description="seed of the sampling engine's own stream")
    torch_threads: int | None = Field(None, gt=0, description="torch CPU threads of the front's process; null: "
                                      "torch's default. Where the front shares a few cores with its clients or "
                                      "other work, oversubscribed threads slow training and sampling many times: "
                                      "give 1 there")

    @field_validator("model_dir")
    @classmethod
    def _folder(cls, folder: Path) -> Path:
        if not (folder / "config.json").is_file():
            raise ValueError(f"{folder} is no Hugging Face model folder (it has no config.json)")
        return folder

    @field_validator("listen")
    @classmethod
    def _host_port(cls, address: str) -> str:
        return host_port(address)
