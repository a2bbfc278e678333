"""An OpenAI-compatible endpoint on the rollout worker (`/v1/chat/completions`, `/v1/models`) that records, per
session, the exact prompt and completion token ids, log-probs and policy version of every call, so that an agent
written against the OpenAI SDK can be trained on what the model really sampled.

A session is opened with its prompt row (`POST /v1/sessions`), its calls go to `/sessions/ID/v1/chat/completions`
(the OpenAI client's `base_url` is `.../sessions/ID/v1`), and `POST /v1/sessions/ID/close {reward}` ends it and
answers its samples: calls that extend the previous one token for token form one sample (the model's tokens
unmasked, everything between them masked); a call that does not starts a new one (stitch()). Off by default; behind
the service's bearer token. Each answer also carries `prompt_token_ids` and `completion_token_ids`. Sessions opened
as a group (`POST /v1/groups`) are pushed to the buffer as one training group when the last closes (openai_groups.py).
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from typing import Any

import grpc

from zerobubble.common.http_guard import GuardedRequestHandler, RequestGuard
from zerobubble.rollout.config import OpenAIEndpointConfig
from zerobubble.rollout.continuous import BatcherClosed
from zerobubble.rollout.engine import SamplingError, SamplingSettings
from zerobubble.rollout.openai_groups import Group, GroupPusher, row_of

log = logging.getLogger(__name__)
_CHAT_FIELDS = {"model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "stop", "n",
                "stream", "tools", "tool_choice", "seed", "user"}
MAX_STOP = 4  # as OpenAI's API
SEED_RANGE = range(0, 2**63)  # what every engine's generator takes


def _why(exc: Exception) -> str:
    """A peer's failure in one line: a gRPC error's status and details, not its multi-line rendering."""
    if isinstance(exc, grpc.RpcError):
        return f"{exc.code().name}: {exc.details()}"
    return str(exc) or type(exc).__name__


class Refused(Exception):
    """A refusal as the answer's status, its error's `param` (the field) and, for a state an agent acts on, `code`."""

    def __init__(self, status: int, field: str, message: str, code: str | None = None):
        super().__init__(message)
        self.status, self.field, self.code = status, field, code


@dataclass
class Call:
    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    policy_versions: list[int]   # the version that drew each completion token
    finish_reason: str = "stop"
    temperature: float = 1.0
    # Tokens the engine kept at each completion token (top-p or top-k: engine.py's Sample.support); empty: the whole
    # vocabulary every time, as 0 says per token.
    support: list[int] = field(default_factory=list)


@dataclass
class Session:
    row: dict
    calls: list[Call] = field(default_factory=list)
    last_used: float = field(default_factory=time.monotonic)
    group_id: str | None = None
    running: int = 0  # calls admitted and not yet recorded: they count against max_calls_per_session


def stitch(calls: list[Call]) -> list[dict]:
    """The session's samples: a call whose prompt starts with the previous sample's ids extends it (the new prompt
    ids masked, the completion unmasked); any other call starts a sample of its own."""
    samples: list[dict] = []
    for call in calls:
        last = samples[-1] if samples else None
        so_far = None if last is None else last["prompt_ids"] + last["response_ids"]
        if so_far is not None and call.prompt_ids[:len(so_far)] == so_far:
            between = call.prompt_ids[len(so_far):]
            last["response_ids"] += between + call.completion_ids
            last["loss_mask"] += [0] * len(between) + [1] * len(call.completion_ids)
            last["logprobs"] += [0.0] * len(between) + call.logprobs
            last["policy_versions"] += [-1] * len(between) + call.policy_versions
            last["support"] += [0] * len(between) + _support(call)
        else:
            samples.append({"prompt_ids": list(call.prompt_ids), "response_ids": list(call.completion_ids),
                            "loss_mask": [1] * len(call.completion_ids), "logprobs": list(call.logprobs),
                            "policy_versions": list(call.policy_versions),
                            "support": _support(call)})
    return samples


def _support(call: Call) -> list[int]:
    return list(call.support) if call.support else [0] * len(call.completion_ids)


class OpenAIEndpoint:
    """The endpoint over `worker` (its engine, under its lock, at its current weights)."""

    def __init__(self, config: OpenAIEndpointConfig, worker: Any, max_new_tokens: int, token: str | None):
        self.config = config
        self.worker = worker
        self.max_new_tokens = max_new_tokens
        host = config.listen.rsplit(":", 1)[0]
        # The endpoint's lock is the service's token; agents reach it by any name, from any page that holds it.
        self.guard = RequestGuard(host, token, allowed_hosts=("*",), allowed_origins=("*",))
        self._sessions: dict[str, Session] = {}
        self._groups: dict[str, Group] = {}
        self.pusher = GroupPusher(worker)
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer((host, int(config.listen.rsplit(":", 1)[1])), _handler(self))
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="openai-endpoint", daemon=True)

    def start(self) -> OpenAIEndpoint:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    # -- requests --------------------------------------------------------------------------------------
    def models(self) -> dict:
        return {"object": "list", "data": [{"id": self.config.model_name, "object": "model", "created": 0,
                                            "owned_by": "zerobubble"}]}

    def open(self, body: dict) -> dict:
        row = body.get("row", {})
        if not isinstance(row, dict):
            raise Refused(400, "row", "row: must be an object (the prompt row)")
        with self._lock:
            self._expire()
            if len(self._sessions) >= self.config.max_sessions:
                raise Refused(429, "sessions", f"{self.config.max_sessions} sessions are open (max_sessions)")
            session_id = uuid.uuid4().hex
            self._sessions[session_id] = Session(row)
        return {"session_id": session_id, "base_url": f"/sessions/{session_id}/v1"}

    def open_group(self) -> dict:
        """Lease one prompt and open run_spec.num_generations sessions on it (see openai_groups.py)."""
        size = self.worker.spec.num_generations
        with self._lock:
            self._expire()
            if len(self._sessions) + size > self.config.max_sessions:
                raise Refused(429, "sessions", f"a group of {size} sessions would pass max_sessions="
                                               f"{self.config.max_sessions}")
        try:
            lease = self.pusher.lease()
        except Exception as exc:  # noqa: BLE001 - the buffer stayed away past its retries
            raise Refused(503, "groups", f"no prompt could be leased, the buffer did not answer ({_why(exc)}); "
                                         "ask again later") from None
        # States an agent stops on are 410 with the state as the error's code; 429 means "ask again".
        if lease.end_of_data:
            raise Refused(410, "groups", "the data is finished: no more prompts will come", "data_finished")
        if lease.training_finished and not lease.prompts:
            raise Refused(410, "groups", "training has finished: the trainer made its last step, so no group will "
                                         "be trained on", "training_finished")
        if not lease.prompts:
            raise Refused(429, "groups", "no prompt can be leased now (the buffer is full or training has "
                                         "finished); ask again later")
        group_id = uuid.uuid4().hex
        row = row_of(lease.prompts[0], ground_truth=self.config.group_ground_truth)
        sessions = [uuid.uuid4().hex for _ in range(size)]
        with self._lock:
            self._groups[group_id] = Group(lease, sessions)
            for session_id in sessions:
                self._sessions[session_id] = Session(row, group_id=group_id)
        return {"group_id": group_id, "row": row, "sessions": sessions,
                "base_urls": [f"/sessions/{session_id}/v1" for session_id in sessions]}

    def close(self, session_id: str, body: dict) -> dict:
        reward = body.get("reward")
        with self._lock:
            session = self._sessions.get(session_id)
        if session is None:
            raise Refused(404, "session_id", f"no open session {session_id!r}")
        if (reward is not None or session.group_id is None) and (
                isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward)):
            raise Refused(400, "reward", "reward: must be a finite number" + (" or null (the row's verifier scores the "
                                                                       "final answer)" if session.group_id else ""))
        reward = None if reward is None else float(reward)
        if session.group_id is not None and not session.calls:
            raise Refused(409, "session_id", "the session made no call: a group's session closes after its agent ran")
        with self._lock:
            if self._sessions.pop(session_id, None) is None:
                raise Refused(404, "session_id", f"no open session {session_id!r}")
            samples = stitch(session.calls)
            group = self._groups.get(session.group_id) if session.group_id else None
            if group is not None:
                last = session.calls[-1]
                group.closed[session_id] = ({**samples[-1], "finish_reason": last.finish_reason,
                                             "temperature": last.temperature,
                                             "last_completion": last.completion_ids}, reward)
                self.worker.metrics.openai_chains_dropped.inc(len(samples) - 1)
                if len(group.closed) == len(group.session_ids):
                    del self._groups[session.group_id]
                else:
                    group = None
        self.worker.forget(session_id)
        answer = {"session_id": session_id, "reward": reward, "row": session.row, "samples": samples}
        if group is not None:
            try:
                answer["group"] = self.pusher.push(group)
            except Exception as exc:  # noqa: BLE001 - the buffer or reward service stayed away past its retries
                log.warning("the group of prompt %s could not be pushed: %r", group.prompt.prompt_id, exc)
                back = ("went back to the buffer" if self.pusher.give_back(group) else
                        "goes back to the buffer when its lease expires")
                raise Refused(503, "group", f"the group could not be scored or pushed ({_why(exc)}); its prompt "
                                            f"{back}") from None
        return answer

    def complete(self, session_id: str, body: dict) -> dict:
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None:
                raise Refused(404, "session_id", f"no open session {session_id!r}")
            session.last_used = time.monotonic()
        prompt_ids, sampling = self._request(body)  # refused here, before the engine is waited for
        with self._lock:
            # The slot is taken before generating, so that concurrent calls cannot all pass the check.
            if len(session.calls) + session.running >= self.config.max_calls_per_session:
                raise Refused(429, "session_id", f"the session made or is making its "
                                                 f"{self.config.max_calls_per_session} calls already "
                                                 "(max_calls_per_session)")
            session.running += 1
        try:
            try:
                sample, versions = self.worker.complete(prompt_ids, sampling, key=session_id)
            except BatcherClosed:
                raise Refused(503, "session_id", "the service is stopping: the engine takes no more calls") from None
            completion = [int(token) for token in sample.token_ids]
            logprobs = [float(value) for value in sample.logprobs]
            support = [] if sample.support is None else [int(kept) for kept in sample.support]
            with self._lock:
                session.calls.append(Call(prompt_ids, completion, logprobs, versions, sample.finish_reason,
                                          sampling.temperature, support))
        finally:
            with self._lock:
                session.running -= 1
        text = self.worker.engine.tokenizer.decode(completion, skip_special_tokens=True)
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                "model": self.config.model_name,
                "choices": [{"index": 0, "finish_reason": sample.finish_reason,
                             "message": {"role": "assistant", "content": text}}],
                "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(completion),
                          "total_tokens": len(prompt_ids) + len(completion)},
                "prompt_token_ids": prompt_ids, "completion_token_ids": completion,
                "policy_version": min(versions, default=self.worker.engine.policy_version)}

    def _request(self, body: dict) -> tuple[list[int], SamplingSettings]:
        unknown = sorted(set(body) - _CHAT_FIELDS)
        if unknown:
            raise Refused(400, unknown[0], f"{unknown[0]}: not supported here (the fields taken: "
                                           f"{', '.join(sorted(_CHAT_FIELDS))})")
        if body.get("stream"):
            raise Refused(400, "stream", "stream: not supported; the answer comes whole")
        if body.get("n", 1) != 1:
            raise Refused(400, "n", "n: only 1 (each call is one sample of the session)")
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
            raise Refused(400, "messages", "messages: a non-empty list of {role, content}")
        messages = [{**m, "content": m.get("content") or ""} for m in messages]
        tools = body.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise Refused(400, "tools", "tools: must be a list of function schemas")
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens", self.max_new_tokens))
        name = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or not 0 < max_tokens <= \
                self.max_new_tokens:
            raise Refused(400, name, f"{name}: an integer from 1 to {self.max_new_tokens} (run_spec.max_new_tokens)")
        try:
            sampling = SamplingSettings(n=1, temperature=_number(body, "temperature"), top_p=_number(body, "top_p"),
                                        max_new_tokens=max_tokens, stop=_stop(body.get("stop")),
                                        seed=_seed(body.get("seed")))
        except SamplingError as exc:
            raise Refused(400, exc.field, str(exc)) from None
        builder = self.worker.prompts
        try:
            ids = builder.render(messages, tools)
        except Exception as exc:  # noqa: BLE001 - the chat template's many failures mean one thing to the caller
            raise Refused(400, "messages", f"messages: the chat template refused them: {exc}") from None
        if len(ids) > builder.max_prompt_tokens:
            raise Refused(400, "messages", f"messages: {len(ids)} tokens, over run_spec.max_prompt_tokens="
                                           f"{builder.max_prompt_tokens}")
        return ids, sampling

    def _expire(self) -> None:
        """Drop idle sessions; a group that loses one can never finish: its other sessions go too and its prompt
        goes back to the buffer (on a thread of its own, as this runs under the lock)."""
        cutoff = time.monotonic() - self.config.session_idle_s
        for session_id in [key for key, session in self._sessions.items() if session.last_used < cutoff]:
            session = self._sessions.pop(session_id, None)
            if session is None:
                continue
            log.info("the OpenAI session %s had no call for %.0f s: dropped", session_id, self.config.session_idle_s)
            group = self._groups.pop(session.group_id, None) if session.group_id else None
            if group is not None:
                for other in group.session_ids:
                    self._sessions.pop(other, None)
                threading.Thread(target=self.pusher.give_back, args=(group,), name="openai-give-back",
                                 daemon=True).start()


def _number(body: dict, name: str) -> float:
    value = body.get(name, 1.0)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise Refused(400, name, f"{name}: must be a finite number")
    return float(value)


def _stop(stop: Any) -> tuple[str, ...]:
    if stop is None:
        return ()
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or len(stop) > MAX_STOP or not all(isinstance(s, str) for s in stop):
        raise Refused(400, "stop", f"stop: a string or a list of at most {MAX_STOP} strings")
    return tuple(stop)


def _seed(seed: Any) -> int | None:
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed not in SEED_RANGE):
        raise Refused(400, "seed", "seed: an integer from 0 to 2**63 - 1")
    return seed


def _handler(endpoint: OpenAIEndpoint) -> type[GuardedRequestHandler]:
    class Handler(GuardedRequestHandler):
        # A request arrives whole within io_timeout_s (head and body together), and no read waits longer.
        timeout = request_deadline_s = endpoint.config.io_timeout_s
        deadline_setting = "io_timeout_s"
        max_body_bytes = endpoint.config.max_body_bytes
        guard = endpoint.guard

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
            log.debug(format, *args)

        def _answer(self, status: int, payload: dict) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def refuse(self, status: int, field: str, message: str, code: str | None = None) -> None:
            self._answer(status, {"error": {"message": message, "type": "invalid_request_error", "param": field,
                                            "code": code}})

        def _route(self, method: str) -> None:
            parts = [part for part in self.path.split("?")[0].split("/") if part]
            try:
                if method == "GET" and (parts == ["v1", "models"] or parts[:1] == ["sessions"]
                                        and parts[2:] == ["v1", "models"]):
                    self._answer(200, endpoint.models())
                    return
                if method != "POST":
                    raise Refused(404, "path", f"no route GET {self.path}")
                body = self._body()
                if parts == ["v1", "sessions"]:
                    self._answer(200, endpoint.open(body))
                elif parts == ["v1", "groups"]:
                    self._answer(200, endpoint.open_group())
                elif len(parts) == 4 and parts[:2] == ["v1", "sessions"] and parts[3] == "close":
                    self._answer(200, endpoint.close(parts[2], body))
                elif len(parts) == 5 and parts[0] == "sessions" and parts[2:] == ["v1", "chat", "completions"]:
                    self._answer(200, endpoint.complete(parts[1], body))
                else:
                    raise Refused(404, "path", f"no route POST {self.path}")
            except Refused as refused:
                self.refuse(refused.status, refused.field, str(refused), refused.code)
            except Exception:
                log.exception("OpenAI endpoint: %s %s failed", method, self.path)
                self.refuse(500, "", "internal error; see the service's log")

        def _body(self) -> dict:
            try:
                body = json.loads(self.body or b"{}")
            except (ValueError, RecursionError):
                raise Refused(400, "body", "the body is not JSON") from None
            if not isinstance(body, dict):
                raise Refused(400, "body", "the body must be a JSON object")
            return body

        def do_GET(self) -> None:  # noqa: N802 - the base class's name
            self._route("GET")

        def do_POST(self) -> None:  # noqa: N802
            self._route("POST")

    return Handler
