"""The JSON contracts of the reward service's HTTP endpoints: request bodies to ScoreItems, Scores to replies.

No HTTP here (that is http_server.py) and no scoring (the RewardScorer core). Each contract also says how a
field the core names (`items[3].response`) is called in its own request (`query[3]`), so an error names what
the caller sent.

- POST /v1/score: the JSON form of ScoreRequest (answered with a ScoreResult) or of ScoreBatchRequest
  ({"items": [...]}, answered with ScoreBatchReply), as protobuf's json_format reads and writes them.
- POST /get_reward: OpenRLHF's remote reward model (`--remote_rm_url`), as its client
  (openrlhf/utils/agent.py, SingleTurnAgentExecutor._fetch_rewards_via_http, OpenRLHF 0.11.2) sends it:
  {"query": [prompt + response, ...], "prompts": [...], "labels": [...]}, answered with
  {"rewards": [...], "scores": [...], "extra_logs": {...}} as its own serve_rm does.
- POST /reward: slime's remote reward model (`--rm-type remote_rm --rm-url`), as its client
  (slime/rollout/rm_hub/__init__.py, remote_rm) sends it: {"prompt", "response", "label"} per sample; the
  reply body is the reward itself, a JSON number, which is what slime keeps as the sample's reward.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from google.protobuf import json_format

from zerobubble.common.errors import InvalidInput, ServiceError, TooLarge
from zerobubble.reward.config import RewardValues
from zerobubble.reward.scorer import Score
from zerobubble.reward.servicer import to_item, to_result
from zerobubble.reward.verifiers import ScoreItem
from zerobubble.v1 import reward_pb2

_ITEM_FIELD = re.compile(r"items\[(\d+)\]\.(\w+)(.*)", re.DOTALL)
_PARSE_FIELD = re.compile(r"Failed to parse (\w+) field")
_UNKNOWN_FIELD = re.compile(r'no field named "([^"]+)"|multiple "(\w+)" oneof')


@dataclass(frozen=True)
class Parsed:
    """What a request body asks to score, and how to name the core's fields in the caller's terms."""

    items: list[ScoreItem]
    rename: Callable[[str], str]


def renamed(exc: ServiceError, rename: Callable[[str], str]) -> ServiceError:
    """The same error, its field called as the caller's request calls it."""
    if exc.field is None:
        return exc
    message = str(exc).removeprefix(f"{exc.field}: ")
    return type(exc)(message, field=rename(exc.field))


def _fields(names: dict[str, str], whole: str | None) -> Callable[[str], str]:
    """A renamer: `names` maps a ScoreItem field to the request field that gave it, the i-th entry of a list
    when `whole` names the list that stands for all items, the field itself for a one-item request."""

    def rename(field: str) -> str:
        match = _ITEM_FIELD.fullmatch(field)
        if match is None:
            return whole if field == "items" and whole else field
        index, name, rest = match.groups()
        if whole is None:
            return f"{names.get(name, name)}{rest}"
        # A field of no list (the verifier, from the URL) names itself.
        return f"{names[name]}[{index}]{rest}" if name in names else name

    return rename


def json_body(raw: bytes, max_digits: int, bounded: dict[str, int] | None = None) -> Any:
    """The body as JSON. A list that `bounded` names (a key of the top-level object -> its most entries) is read
    entry by entry and refused past its bound, before the rest is parsed: a batch of a million items costs
    its first entries, not a million. A number of more than `max_digits` digits (whose conversion costs time
    quadratic in its length) or nesting past the parser's recursion limit is bad input, not a crash."""

    def integer(text: str) -> int:
        if len(text.lstrip("-")) > max_digits:
            raise InvalidInput(f"a number of {len(text)} digits; at most {max_digits} "
                               "(http.max_json_digits)", field="body")
        return int(text)

    try:
        text = raw.decode()
        if bounded:
            return _bounded_object(text, json.JSONDecoder(parse_int=integer), bounded)
        return json.loads(text, parse_int=integer)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidInput(f"not JSON: {exc}", field="body") from None
    except RecursionError:
        raise InvalidInput("nested too deep", field="body") from None


_BLANK = re.compile(r"[ \t\n\r]*")


def _skip(text: str, at: int) -> int:
    return _BLANK.match(text, at).end()


def _expect(text: str, at: int, what: str) -> json.JSONDecodeError:
    return json.JSONDecodeError(f"Expecting {what}", text, at)


def _bounded_object(text: str, decoder: json.JSONDecoder, bounded: dict[str, int]) -> Any:
    """json.loads(text), reading the lists `bounded` names one entry at a time (see json_body)."""
    at = _skip(text, 0)
    if not text.startswith("{", at):
        return decoder.decode(text)   # not an object: the contract refuses it by its type
    found: dict[str, Any] = {}
    at = _skip(text, at + 1)
    if text.startswith("}", at):
        at += 1
    else:
        while True:
            key, at = decoder.raw_decode(text, at)
            if not isinstance(key, str):
                raise _expect(text, at, "property name enclosed in double quotes")
            at = _skip(text, at)
            if not text.startswith(":", at):
                raise _expect(text, at, "':' delimiter")
            at = _skip(text, at + 1)
            if key in bounded and text.startswith("[", at):
                found[key], at = _bounded_list(text, decoder, at, bounded[key], key)
            else:
                found[key], at = decoder.raw_decode(text, at)
            at = _skip(text, at)
            if text.startswith("}", at):
                at += 1
                break
            if not text.startswith(",", at):
                raise _expect(text, at, "',' delimiter")
            at = _skip(text, at + 1)
    if _skip(text, at) != len(text):
        raise json.JSONDecodeError("Extra data", text, at)
    return found


def _bounded_list(text: str, decoder: json.JSONDecoder, at: int, limit: int, field: str) -> tuple[list, int]:
    entries: list = []
    at = _skip(text, at + 1)
    if text.startswith("]", at):
        return entries, at + 1
    while True:
        if len(entries) == limit:
            raise TooLarge(f"more than {limit} items exceed limits.max_batch_items={limit}", field=field)
        entry, at = decoder.raw_decode(text, at)
        entries.append(entry)
        at = _skip(text, at)
        if text.startswith("]", at):
            return entries, at + 1
        if not text.startswith(",", at):
            raise _expect(text, at, "',' delimiter")
        at = _skip(text, at + 1)


def _object(body: Any) -> dict:
    if not isinstance(body, dict):
        raise InvalidInput(f"expected a JSON object, got {type(body).__name__}", field="body")
    return body


def _ground_truth(label: Any, kind: str, field: str) -> dict:
    """ScoreItem fields from a peer's label: the answer (a string, or a number written as one) for math
    verifiers; {"inputs": [...], "outputs": [...]} (or that object as a JSON string) for code."""
    if kind == "gt_answer":
        if label is None:
            return {}
        if isinstance(label, bool) or not isinstance(label, str | int | float):
            raise InvalidInput(f"expected the answer as a string, got {type(label).__name__}", field=field)
        return {"gt_answer": str(label)}
    if kind == "test_cases":
        if isinstance(label, str):
            try:
                label = json.loads(label)
            except json.JSONDecodeError:
                raise InvalidInput('expected test cases {"inputs": [...], "outputs": [...]}', field=field) from None
        if not isinstance(label, dict):
            raise InvalidInput('expected test cases {"inputs": [...], "outputs": [...]}', field=field)
        tests = {}
        for key in ("inputs", "outputs"):
            values = label.get(key)
            if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
                raise InvalidInput("expected a list of strings", field=f"{field}.{key}")
            tests[f"test_{key}"] = values
        return tests
    return {}


def _strings(body: dict, key: str) -> list:
    values = body.get(key)
    if not isinstance(values, list):
        raise InvalidInput(f"expected a list, got {type(values).__name__}", field=key)
    return values


def _text(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise InvalidInput(f"expected a string, got {type(value).__name__}", field=field)
    return value


# -- POST /v1/score -------------------------------------------------------------------------------------
def _parse_error_field(message: str) -> str:
    unknown = _UNKNOWN_FIELD.search(message)
    if unknown:
        return unknown.group(1) or unknown.group(2)
    return ".".join(_PARSE_FIELD.findall(message)) or "body"


def score_request(body: Any) -> tuple[Parsed, bool]:
    """(what to score, whether it is a batch) from the JSON form of ScoreRequest or ScoreBatchRequest."""
    body = _object(body)
    batch = "items" in body
    message = reward_pb2.ScoreBatchRequest() if batch else reward_pb2.ScoreRequest()
    try:
        json_format.ParseDict(body, message)
    except json_format.ParseError as exc:
        raise InvalidInput(str(exc), field=_parse_error_field(str(exc))) from None
    requests = list(message.items) if batch else [message]
    rename = (lambda field: field) if batch else _fields({}, None)
    items = [to_item(request, f"items[{i}]." if batch else "") for i, request in enumerate(requests)]
    return Parsed(items, rename), batch


def score_reply(scores: list[Score], batch: bool) -> dict:
    results = [to_result(score) for score in scores]
    message = reward_pb2.ScoreBatchReply(results=results) if batch else results[0]
    return json_format.MessageToDict(message, preserving_proto_field_name=True,
                                     always_print_fields_with_no_presence=True)


# -- POST /get_reward (OpenRLHF) ------------------------------------------------------------------------
def _response_of(query: str, prompt: str) -> str:
    """OpenRLHF sends prompt + response decoded as one string; the response is what follows the prompt."""
    at = query.find(prompt) if prompt else -1
    return query[at + len(prompt):] if at >= 0 else query


def openrlhf_request(body: Any, verifier: str, ground_truth: str) -> Parsed:
    body = _object(body)
    queries = [_text(q, f"query[{i}]") for i, q in enumerate(_strings(body, "query"))]
    count = len(queries)
    prompts = _strings(body, "prompts") if body.get("prompts") is not None else [""] * count
    labels = _strings(body, "labels") if body.get("labels") is not None else [None] * count
    for key, values in (("prompts", prompts), ("labels", labels)):
        if len(values) != count:
            raise InvalidInput(f"{len(values)} entries for {count} queries", field=key)
    items = []
    for i, (query, prompt, label) in enumerate(zip(queries, prompts, labels, strict=True)):
        prompt = _text(prompt, f"prompts[{i}]")
        response = _response_of(query, prompt)
        items.append(ScoreItem(verifier=verifier, response=response, prompt=query[:len(query) - len(response)],
                               id=str(i), **_ground_truth(label, ground_truth, f"labels[{i}]")))
    return Parsed(items, _fields({"response": "query", "prompt": "prompts", "gt_answer": "labels",
                                  "test_cases": "labels"}, "query"))


def _share(score: Score, rewards: RewardValues) -> float:
    """The reward rescaled to [0, 1], which OpenRLHF's dynamic filtering reads as `scores`."""
    span = rewards.correct - rewards.wrong
    return (score.reward - rewards.wrong) / span if span else float(score.verdict.answer_ok)


def openrlhf_reply(scores: list[Score], rewards: RewardValues) -> dict:
    return {
        "rewards": [score.reward for score in scores],
        "scores": [_share(score, rewards) for score in scores],
        # Per sample, like the rewards, as OpenRLHF's own reward model server logs them.
        "extra_logs": {
            "answer_ok": [float(score.verdict.answer_ok) for score in scores],
            "format_ok": [float(score.verdict.format_ok) for score in scores],
        },
    }


# -- POST /reward (slime) -------------------------------------------------------------------------------
def slime_request(body: Any, verifier: str, ground_truth: str) -> Parsed:
    body = _object(body)
    prompt = body.get("prompt")
    # slime's prompt is text or chat messages; the reward model reads it when it is text.
    if prompt is not None and not isinstance(prompt, str | list):
        raise InvalidInput(f"expected text or a list of messages, got {type(prompt).__name__}", field="prompt")
    item = ScoreItem(verifier=verifier, response=_text(body.get("response"), "response"),
                     prompt=prompt if isinstance(prompt, str) else "",
                     **_ground_truth(body.get("label"), ground_truth, "label"))
    return Parsed([item], _fields({"gt_answer": "label", "test_cases": "label"}, None))


def slime_reply(scores: list[Score]) -> float:
    return scores[0].reward
