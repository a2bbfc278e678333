"""The reward service's configuration schema (all defaults are here)."""

from __future__ import annotations

import os

from pydantic import Field, field_validator, model_validator

from zerobubble.common.config import Schema, ServerConfig


class RewardValues(Schema):
    """What a verdict is worth. The reference (Colossal-RL) uses correct=10, wrong=0."""

    correct: float = 1.0
    wrong: float = 0.0


class MathConfig(Schema):
    workers: int = Field(default_factory=lambda: os.cpu_count() or 1, gt=0,
                         description="verification processes (default: one per core)")
    timeout_seconds: float = Field(5.0, gt=0, description="per-item limit; the worker is replaced after it")


class SandboxConfig(Schema):
    """Limits and isolation for running submitted programs (see README, 'Code sandbox')."""

    python: str = Field("python3", description="interpreter that runs submitted programs; it and its "
                        "libraries must live under /usr, the only host folder a program sees")
    bwrap: str = Field("bwrap", description="bubblewrap, which builds each run's namespaces and root (a path "
                       "or a name on PATH); without it the code verifier is off")
    slots: int = Field(default_factory=lambda: os.cpu_count() or 1, gt=0,
                       description="programs run at once; each slot has its own user id and memory cgroup")
    uid_base: int = Field(61000, ge=1000, description="slot i runs as uid/gid uid_base + i")
    wall_seconds: float = Field(10.0, gt=0)
    cpu_seconds: int = Field(10, gt=0)
    memory_bytes: int = Field(512 * 1024 * 1024, gt=0, description="memory of a whole run (a cgroup: all its "
                              "processes, its files in /tmp, its shared memory), and each process's address space")
    max_processes: int = Field(16, gt=0, description="processes the slot's user may own")
    max_file_bytes: int = Field(16 * 1024 * 1024, ge=0, description="largest file it may write")
    max_output_bytes: int = Field(1024 * 1024, gt=0, description="stdout and stderr are cut (and the run "
                                  "killed) past this")
    max_open_files: int = Field(64, gt=3)


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


class HttpConfig(Schema):
    """HTTP/JSON beside gRPC, for tools that speak only HTTP: it shares the scorer, its limits, the bearer
    token, TLS and the metrics of `server`."""

    listen: str | None = Field(None, description="HOST:PORT of the HTTP endpoints (POST /v1/score, OpenRLHF's "
                               "/get_reward, slime's /reward, GET /healthz); null: no HTTP")
    verifier: str = Field("boxed", description="verifier of /get_reward and /reward when the URL does not name "
                          "one with ?verifier=")

    @field_validator("listen")
    @classmethod
    def _host_port(cls, value: str | None) -> str | None:
        # The rule of server.listen, so both listeners take the same addresses.
        return value if value is None else ServerConfig._host_port(value)


class RewardServiceConfig(Schema):
    server: ServerConfig = ServerConfig(listen="127.0.0.1:50052")
    rewards: RewardValues = RewardValues()
    math: MathConfig = Field(default_factory=MathConfig)
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    limits: LimitsConfig = LimitsConfig()
    http: HttpConfig = HttpConfig()

    @model_validator(mode="after")
    def _rewards_ordered(self) -> RewardServiceConfig:
        if self.rewards.correct < self.rewards.wrong:
            raise ValueError("rewards.correct must not be below rewards.wrong")
        return self
