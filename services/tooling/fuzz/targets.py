"""The services under fuzz, each `zerobubble serve` in its own process on loopback with small limits, and the
table of their RPCs: what each may honestly wait for, and valid requests to mutate.

The rollout worker leases from an address where nothing listens (it backs off and stays idle), so that only
the fuzz drives its engine. The trainer pulls from a buffer of its own that never gets a group, the state a
trainer waiting for data is in; the fuzzed buffer gets no trainer, so pulls take only what the fuzz pushed.
"""

from __future__ import annotations

import functools
import json
import resource
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import yaml
from google.protobuf.descriptor import MethodDescriptor
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2, health_pb2_grpc

from zerobubble.buffer.prompts import PromptSource
from zerobubble.common.codec import encode_array
from zerobubble.common.tokenizer_fingerprint import tokenizer_fingerprint
from zerobubble.tooling.ports import free_port
from zerobubble.v1 import buffer_pb2, common_pb2, environment_pb2, reward_pb2, rollout_pb2, teacher_pb2, trainer_pb2

# Where the rollout worker looks for its buffer and reward service: port 1 refuses every connection.
NOWHERE = "127.0.0.1:1"
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
# A service that allocates without bound dies at this instead of taking the machine with it.
MEMORY_LIMIT_BYTES = 4 * 1024**3
START_TIMEOUT_S = 300.0
SERVER = {"listen": "127.0.0.1:0", "metrics_port": None, "max_message_bytes": MAX_MESSAGE_BYTES,
          "grace_seconds": 0.5}
FUZZ_WORKER = "fuzz-worker"
# The reward service's HTTP side closes slow connections after these (http_abuse.py waits them out).
HTTP_HEAD_TIMEOUT_S = 2.0
HTTP_BODY_TIMEOUT_S = 2.0
# Memory-backed where the machine has it: the thousand SaveCheckpoint requests each write (and fsync) a checkpoint,
# which on a disk costs as much again as the rest of the call.
FAST_DISK = Path("/dev/shm")


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))


class ServiceProcess:
    """One `zerobubble serve NAME` process with its config file and log in `directory`."""

    def __init__(self, name: str, config: dict[str, Any], directory: Path):
        self.name = name
        self.directory = directory
        self.config_path = directory / f"{name}.yaml"
        self.log_path = directory / f"{name}.log"
        self.config_path.write_text(yaml.safe_dump(config))
        self.process: subprocess.Popen | None = None
        self.address = ""

    def launch(self) -> ServiceProcess:
        """Start the process; `ready()` waits until it serves."""
        with open(self.log_path, "a") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "zerobubble", "serve", self.name.split("-")[0], "--config",
                 str(self.config_path)],
                stdout=subprocess.PIPE, stderr=log, text=True, preexec_fn=_limit_memory,
            )
        return self

    def start(self) -> ServiceProcess:
        return self.launch().ready()

    def ready(self) -> ServiceProcess:
        ready, _, _ = select.select([self.process.stdout], [], [], START_TIMEOUT_S)
        line = self.process.stdout.readline() if ready else ""
        if not line:
            self.stop()
            raise RuntimeError(f"{self.name} did not start; its log:\n{self.log_tail()}")
        self.address = json.loads(line)["address"]
        return self

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

    def rss_bytes(self) -> int:
        status = Path(f"/proc/{self.process.pid}/status").read_text()
        kilobytes = next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))
        return int(kilobytes) * 1024

    def terminate(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL if it has not exited within `grace_s` (how it shuts down is not fuzzed here)."""
        if self.process is None:
            return
        self.terminate()
        try:
            self.process.wait(grace_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _make_assets(directory: Path) -> tuple[Path, Path]:
    """The 1m tiny model and a small arithmetic task, made by the project's own commands."""
    model, task = directory / "model", directory / "task"
    for args in (["make-tiny-model", str(model), "--size", "1m"],
                 ["make-task", "arithmetic", str(task), "--train-size", "64", "--eval-size", "8"]):
        subprocess.run([sys.executable, "-m", "zerobubble", *args], check=True, capture_output=True)
    return model, task / "train.jsonl"


class Deployment:
    """Every service under fuzz, in `directory`; `revive()` restarts whichever died."""

    def __init__(self, directory: Path):
        directory.mkdir(parents=True, exist_ok=True)
        model, prompts = _make_assets(directory)
        buffer = {"server": SERVER, "prompts": {"path": str(prompts)}, "wal": {"fsync": "never"},
                  "capacity": {"max_groups": 100_000, "max_bytes": 256 * 1024**2,
                               "max_group_bytes": MAX_MESSAGE_BYTES // 2},
                  # Pulls may wait at most a second, so a pull that outlasts its deadline is a hang.
                  "pull": {"max_wait_seconds": 1.0},
                  # The valid group (_group) has two trajectories.
                  "run_spec": {"num_generations": 2, "max_new_tokens": 4}}
        # HTTP needs a port known before the start: its listener does not report the one it took.
        self.reward_http = f"127.0.0.1:{free_port()}"
        configs = {
            "reward": {"server": SERVER, "math": {"workers": 1, "timeout_seconds": 2.0},
                       "sandbox": {"slots": 1, "wall_seconds": 2.0, "cpu_seconds": 2},
                       "http": {"listen": self.reward_http, "header_timeout_seconds": HTTP_HEAD_TIMEOUT_S,
                                "body_timeout_seconds": HTTP_BODY_TIMEOUT_S}},
            "buffer": {**buffer, "wal": {**buffer["wal"], "directory": str(directory / "buffer-wal")}},
            "buffer-quiet": {**buffer, "wal": {**buffer["wal"], "directory": str(directory / "quiet-wal")}},
            # The built-ins, in both call formats; the python tool's programs go to the sandbox.
            # Small request bounds: a generated request within them is a forward pass of milliseconds.
            "teacher": {"server": SERVER, "model": {"path": str(model)},
                        "limits": {"max_sequences": 8, "max_tokens_per_request": 512, "batch_tokens": 512}},
            "environment": {"server": SERVER, "environments": [
                {"name": "calculator", "builtin": "calculator", "final_answer": "exact"},
                {"name": "calc_compact", "builtin": "calculator", "tool_format": "compact"},
                {"name": "python", "builtin": "python", "tool_format": "compact"}],
                "limits": {"step_timeout_s": 2.0, "idle_timeout_s": 30.0},
                "sandbox": {"slots": 1, "wall_seconds": 2.0, "cpu_seconds": 2}},
        }
        self.processes = {name: ServiceProcess(name, config, directory).launch() for name, config in configs.items()}
        self.processes["buffer-quiet"].ready()
        # The worker takes the run spec and one prompt from the quiet buffer, then waits on a reward service that
        # never answers: it pushes nothing there, and its engine is the Generate RPC's.
        configs["rollout"] = {
            "server": SERVER, "worker_id": "fuzz-rollout", "torch_threads": 1,
            "model": {"path": str(model), "device": "cpu", "dtype": "fp32"}, "generation": {"prompts_per_batch": 1},
            "buffer": {"address": self.processes["buffer-quiet"].address, "retry_seconds": 0},
            "reward_service": {"address": NOWHERE, "retry_seconds": 86_400}, "trainer": None}
        self.processes["rollout"] = ServiceProcess("rollout", configs["rollout"], directory).launch()
        self.trainer_run = Path(tempfile.mkdtemp(prefix="zerobubble-fuzz-trainer-",
                                                 dir=FAST_DISK if FAST_DISK.is_dir() else directory))
        # A short pull wait: a stop (the restart before WatchWeights) waits for the pull in progress.
        configs["trainer"] = {
            "server": SERVER, "model": str(model), "run_dir": str(self.trainer_run), "torch_threads": 1,
            "algorithm": {"preset": "GRPO", "beta": 0.0}, "batch": {"groups_per_step": 1, "pull_wait_seconds": 0.1},
            "checkpoint": {"keep": 1}, "weight_sync": {"member_timeout_s": 2.0},
            "buffer": {"address": self.processes["buffer-quiet"].address, "timeout_seconds": 10.0},
        }
        self.processes["trainer"] = ServiceProcess("trainer", configs["trainer"], directory).launch()
        self.prompts = prompts
        self.model = model
        self._channels: dict[str, tuple[str, grpc.Channel]] = {}
        for process in self.processes.values():
            if not process.address:
                process.ready()

    def channel(self, service: str) -> grpc.Channel:
        address = self.processes[service].address
        cached = self._channels.get(service)
        if cached is None or cached[0] != address:
            if cached is not None:
                cached[1].close()
            channel = grpc.insecure_channel(address, options=[("grpc.max_receive_message_length", -1)])
            self._channels[service] = cached = (address, channel)
        return cached[1]

    def restart(self, service: str) -> None:
        """A fresh process of `service`, without the state earlier calls left in it."""
        self.processes[service].stop()
        self.processes[service].start()

    def revive(self) -> list[str]:
        """Restart every service that is no longer running; their names."""
        dead = [name for name, process in self.processes.items() if not process.alive()]
        for name in dead:
            self.processes[name].start()
        return dead

    def close(self) -> None:
        for _, channel in self._channels.values():
            channel.close()
        for process in self.processes.values():
            process.terminate()
        for process in self.processes.values():
            process.stop()
        shutil.rmtree(self.trainer_run, ignore_errors=True)


@dataclass(frozen=True)
class Rpc:
    """One RPC of one service as the fuzz sees it."""

    service: str
    method: MethodDescriptor
    seeds: Callable[[Deployment], list[Message]] = lambda deployment: []
    # Whether a call may honestly outlast its deadline before the first reply (a stream that stays open).
    may_wait: Callable[[Message], bool] = lambda request: False
    deadline_s: float = 10.0
    # Whether its run needs a fresh process of its service, without state other runs left in it.
    fresh: bool = False

    @property
    def name(self) -> str:
        return f"{self.service}.{self.method.name}"

    @property
    def path(self) -> str:
        return f"/{self.method.containing_service.full_name}/{self.method.name}"

    @property
    def request_type(self):
        return self.method.input_type

    @property
    def streams_requests(self) -> bool:
        return self.method.client_streaming

    @property
    def streams_replies(self) -> bool:
        return self.method.server_streaming


def _score_seeds(_: Deployment) -> list[Message]:
    code = "```python\nprint(int(input()) + 1)\n```"
    return [
        reward_pb2.ScoreRequest(id="a", verifier="boxed", response="so \\boxed{\\frac{1}{2}}", gt_answer="0.5"),
        reward_pb2.ScoreRequest(id="b", verifier="think_answer_tags", response="<think>x</think><answer>4</answer>",
                                gt_answer="4"),
        reward_pb2.ScoreRequest(id="c", verifier="code", response=code,
                                test_cases=common_pb2.TestCases(inputs=["1\n"], outputs=["2\n"])),
    ]


def _first_prompt(deployment: Deployment) -> common_pb2.Prompt:
    return PromptSource.load(deployment.prompts, shuffle=False).rows[0].to_message(0)


def _group(deployment: Deployment) -> common_pb2.ExperienceGroup:
    def ints(*values: int) -> common_pb2.Array:
        return common_pb2.Array(dtype=common_pb2.DTYPE_INT32, shape=[len(values)],
                                data=b"".join(v.to_bytes(4, "little", signed=True) for v in values))

    group = common_pb2.ExperienceGroup(prompt=_first_prompt(deployment), prompt_ids=ints(1, 2, 3),
                                       producer_id="fuzz", sequence=0)
    for reward in (0.0, 1.0):
        group.trajectories.add(
            response_ids=ints(4, 5), finish_reason=common_pb2.FINISH_REASON_STOP, reward=reward,
            answer_ok=bool(reward), policy_version=0, temperature=1.0, response_text="\\boxed{2}",
            behaviour_logprobs=common_pb2.Array(dtype=common_pb2.DTYPE_FLOAT32, shape=[2], data=b"\0\0\0\xbf" * 2))
    return group


def _lease(deployment: Deployment) -> list[Message]:
    return [buffer_pb2.LeaseRequest(worker_id="fuzz", count=1)]


def _watch_seeds(deployment: Deployment) -> list[Message]:
    join = deployment.channel("trainer").unary_unary(
        "/zerobubble.v1.TrainerService/JoinWeightSync", request_serializer=trainer_pb2.JoinRequest.SerializeToString,
        response_deserializer=trainer_pb2.JoinReply.FromString)
    join(trainer_pb2.JoinRequest(worker_id=FUZZ_WORKER, device="cpu"), timeout=10.0)
    return [trainer_pb2.WatchRequest(worker_id=FUZZ_WORKER)]


def _chat(text: str) -> str:
    return json.dumps([{"role": "user", "content": text}])


ENVIRONMENT_ROW = json.dumps({"messages": [{"role": "user", "content": "What is 6 * 7?"}], "ground_truth": "42",
                              "data_source": "fuzz"})


def _open_episode(deployment: Deployment, environment: str) -> str:
    open_episode = deployment.channel("environment").unary_unary(
        "/zerobubble.v1.EnvironmentService/OpenEpisode",
        request_serializer=environment_pb2.OpenEpisodeRequest.SerializeToString,
        response_deserializer=environment_pb2.OpenEpisodeReply.FromString)
    return open_episode(environment_pb2.OpenEpisodeRequest(environment=environment, row_json=ENVIRONMENT_ROW),
                        timeout=10.0).episode_id


def _step_seeds(deployment: Deployment) -> list[Message]:
    turns = [("calculator", '<tool_call>{"name": "calculator", "arguments": {"expression": "6 * 7"}}</tool_call>'),
             ("calc_compact", "@calculator(6*7) @calculator(2**99999"), ("python", "@python(print(6 * 7))")]
    return [environment_pb2.StepEpisodeRequest(episode_id=_open_episode(deployment, name), assistant_text=text)
            for name, text in turns]


@functools.cache
def _fingerprint_of(model: Path) -> str:
    from transformers import AutoTokenizer

    return tokenizer_fingerprint(AutoTokenizer.from_pretrained(model))


def _fingerprint(deployment: Deployment) -> str:
    """The served model's tokenizer fingerprint, which the teacher asks of every caller."""
    return _fingerprint_of(deployment.model)


def _connect(deployment: Deployment) -> teacher_pb2.ConnectRequest:
    return teacher_pb2.ConnectRequest(tokenizer_fingerprint=_fingerprint(deployment), tokenizer_name="fuzz")


def _logprobs_seeds(deployment: Deployment) -> list[Message]:
    def sequence(length: int, start: int) -> teacher_pb2.TokenSequence:
        return teacher_pb2.TokenSequence(token_ids=encode_array(np.arange(3, 3 + length, dtype=np.int32)),
                                         score_from=start)

    fingerprint = _fingerprint(deployment)
    return [teacher_pb2.LogprobsRequest(tokenizer_fingerprint=fingerprint, sequences=[sequence(12, 5)]),
            teacher_pb2.LogprobsRequest(tokenizer_fingerprint=fingerprint,
                                        sequences=[sequence(4, 1), sequence(30, 20), sequence(2, 1)])]


def _rpc_table() -> list[Rpc]:
    reward = reward_pb2.DESCRIPTOR.services_by_name["RewardService"].methods_by_name
    buffer = buffer_pb2.DESCRIPTOR.services_by_name["BufferService"].methods_by_name
    rollout = rollout_pb2.DESCRIPTOR.services_by_name["RolloutService"].methods_by_name
    trainer = trainer_pb2.DESCRIPTOR.services_by_name["TrainerService"].methods_by_name
    environment = environment_pb2.DESCRIPTOR.services_by_name["EnvironmentService"].methods_by_name
    teacher = teacher_pb2.DESCRIPTOR.services_by_name["TeacherService"].methods_by_name
    generate = [
        rollout_pb2.GenerateRequest(prompts=[_chat("What is 1 + 1?")],
                                    sampling=rollout_pb2.SamplingParams(n=2, max_new_tokens=4, temperature=1.0)),
        rollout_pb2.GenerateRequest(prompts=["1 + 1 ="], raw=True,
                                    sampling=rollout_pb2.SamplingParams(n=1, max_new_tokens=2, top_k=5, stop=["\n"])),
    ]
    return [
        Rpc("reward", reward["Score"], _score_seeds),
        Rpc("reward", reward["ScoreBatch"], lambda d: [reward_pb2.ScoreBatchRequest(items=_score_seeds(d))]),
        Rpc("reward", reward["ScoreStream"], _score_seeds),
        Rpc("reward", reward["ListVerifiers"]),
        Rpc("buffer", buffer["LeasePrompts"], _lease),
        Rpc("buffer", buffer["CompleteLease"],
            lambda d: [buffer_pb2.CompleteLeaseRequest(lease_id="lease-0", prompt_ids=["0"])]),
        Rpc("buffer", buffer["PushExperience"], lambda d: [_group(d)]),
        Rpc("buffer", buffer["PullBatch"],
            lambda d: [buffer_pb2.PullRequest(rank=0, world_size=1, max_groups=2, wait_seconds=0.1)]),
        Rpc("buffer", buffer["Acknowledge"], lambda d: [buffer_pb2.AcknowledgeRequest(deliveries=[1])]),
        Rpc("buffer", buffer["Commit"], lambda d: [buffer_pb2.CommitRequest(delivery=0)]),
        Rpc("buffer", buffer["SetPolicyVersion"], lambda d: [buffer_pb2.SetPolicyVersionRequest(version=1)]),
        Rpc("buffer", buffer["Stats"]),
        Rpc("buffer", buffer["GetRunSpec"]),
        Rpc("rollout", rollout["Generate"], lambda d: generate, deadline_s=30.0),
        Rpc("rollout", rollout["Status"]),
        Rpc("rollout", rollout["Pause"]),
        Rpc("rollout", rollout["Resume"]),
        Rpc("trainer", trainer["JoinWeightSync"], lambda d: [trainer_pb2.JoinRequest(worker_id=FUZZ_WORKER)]),
        # A member's stream stays open between announcements; the only member is the one the seeds make.
        Rpc("trainer", trainer["WatchWeights"], _watch_seeds, may_wait=lambda request: request.worker_id == FUZZ_WORKER,
            deadline_s=3.0, fresh=True),
        Rpc("trainer", trainer["Status"]),
        Rpc("trainer", trainer["SaveCheckpoint"], lambda d: [trainer_pb2.SaveCheckpointRequest(tag="fuzz")]),
        Rpc("environment", environment["ListEnvironments"]),
        Rpc("environment", environment["OpenEpisode"], lambda d: [
            environment_pb2.OpenEpisodeRequest(environment=name, row_json=ENVIRONMENT_ROW)
            for name in ("calculator", "calc_compact", "python")]),
        Rpc("environment", environment["StepEpisode"], _step_seeds),
        Rpc("environment", environment["CloseEpisode"],
            lambda d: [environment_pb2.CloseEpisodeRequest(episode_id=_open_episode(d, "calculator"))]),
        Rpc("teacher", teacher["Connect"], lambda d: [_connect(d)]),
        Rpc("teacher", teacher["Logprobs"], _logprobs_seeds),
    ]


RPCS = _rpc_table()
SERVICES = ("reward", "buffer", "rollout", "trainer", "environment", "teacher")


def health(deployment: Deployment, service: str, timeout: float = 5.0) -> bool:
    stub = health_pb2_grpc.HealthStub(deployment.channel(service))
    try:
        reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=timeout)
    except grpc.RpcError:
        return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def valid_call(deployment: Deployment, service: str, timeout: float = 30.0) -> str | None:
    """A call that must succeed on a healthy service; None when it did, else what went wrong."""
    channel = deployment.channel(service)
    calls = {
        "reward": ("/zerobubble.v1.RewardService/Score", _score_seeds(deployment)[0], reward_pb2.ScoreResult,
                   lambda reply: reply.answer_ok),
        "buffer": ("/zerobubble.v1.BufferService/Stats", buffer_pb2.StatsRequest(), buffer_pb2.StatsReply,
                   lambda reply: True),
        "rollout": ("/zerobubble.v1.RolloutService/Generate",
                    rollout_pb2.GenerateRequest(prompts=[_chat("1 + 1?")],
                                                sampling=rollout_pb2.SamplingParams(n=1, max_new_tokens=2)),
                    rollout_pb2.GenerateReply, lambda reply: len(reply.completions) == 1),
        "trainer": ("/zerobubble.v1.TrainerService/Status", trainer_pb2.TrainerStatusRequest(),
                    trainer_pb2.TrainerStatusReply, lambda reply: True),
        "environment": ("/zerobubble.v1.EnvironmentService/OpenEpisode",
                        environment_pb2.OpenEpisodeRequest(environment="calculator", row_json=ENVIRONMENT_ROW),
                        environment_pb2.OpenEpisodeReply, lambda reply: bool(reply.episode_id)),
        "teacher": ("/zerobubble.v1.TeacherService/Connect", _connect(deployment), teacher_pb2.ConnectReply,
                    lambda reply: reply.vocab_size > 0),
    }
    path, request, reply_type, good = calls[service]
    started = time.monotonic()
    try:
        reply = channel.unary_unary(path, request_serializer=type(request).SerializeToString,
                                    response_deserializer=reply_type.FromString)(request, timeout=timeout)
    except grpc.RpcError as exc:
        return f"{path}: {exc.code().name} {exc.details()} after {time.monotonic() - started:.1f} s"
    return None if good(reply) else f"{path}: unexpected reply {reply}"
