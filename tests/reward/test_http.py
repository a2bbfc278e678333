"""The reward service's HTTP endpoints, through a running `zerobubble serve reward` on loopback.

OpenRLHF's and slime's requests are sent as their own clients send them: aiohttp's session.post(url,
json=payload), raise_for_status(), response.json() (OpenRLHF 0.11.2 openrlhf/utils/agent.py
SingleTurnAgentExecutor._fetch_rewards_via_http; slime rollout/rm_hub/__init__.py remote_rm).
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import ssl
import threading
import time
import urllib.request

import aiohttp
import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from http_helpers import serve_reward

from zerobubble.common.clients.reward import RewardClient, score_request
from zerobubble.common.config import ClientConfig, TLSConfig

TOKEN = "http-test-token"
PROMPT = "<|im_start|>system\nPut your final answer within \\boxed{}.<|im_end|>\n<|im_start|>user\n{q}<|im_end|>\n"


@pytest.fixture(scope="module")
def served():
    with serve_reward() as served:
        yield served


def _post(url: str, payload, **session_options):
    """As OpenRLHF and slime post: aiohttp, json=payload, raise_for_status, response.json()."""

    async def post():
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
            async with session.post(url, json=payload, **session_options) as response:
                response.raise_for_status()
                return await response.json()

    return asyncio.run(post())


def _refusal(url: str, *, data: bytes | None = None, payload=None, headers=None, **options) -> tuple[int, dict]:
    """(status, JSON body) of a request that must fail."""

    async def post():
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
            async with session.post(url, data=data, json=payload, headers=headers, **options) as response:
                return response.status, await response.json()

    status, body = asyncio.run(post())
    assert status >= 400, body
    return status, body["error"]


def test_openrlhf_get_reward_as_its_client_sends_it(served):
    questions = [("1+1=", "2", " \\boxed{2}<|im_end|>"), ("2+2=", "4", " so \\boxed{5}<|im_end|>"),
                 ("x^2=1, x=", "1, -1", " \\boxed{1} and \\boxed{-1}<|im_end|>"),
                 ("3+3=", "6", " it is 6<|im_end|>")]
    prompts = [PROMPT.replace("{q}", q) + "<|im_start|>assistant\n" for q, _, _ in questions]
    payload = {"query": [p + r for p, (_, _, r) in zip(prompts, questions, strict=True)], "prompts": prompts,
               "labels": [label for _, label, _ in questions]}
    reply = _post(f"{served.url}/get_reward", payload)
    assert reply["rewards"] == [1.0, 0.0, 1.0, 0.0]
    assert reply["scores"] == [1.0, 0.0, 1.0, 0.0]
    # The prompt's "\boxed{}" is not the response's: the last response has no box.
    assert reply["extra_logs"] == {"answer_ok": [1.0, 0.0, 1.0, 0.0], "format_ok": [1.0, 1.0, 1.0, 0.0]}


def test_openrlhf_one_query_per_call_and_verifier_in_the_url(served):
    # OpenRLHF's single-turn executor sends one query per call.
    reply = _post(f"{served.url}/get_reward?verifier=think_answer_tags",
                  {"query": ["Q<think>t</think><answer>7</answer>"], "prompts": ["Q"], "labels": [7]})
    assert reply["rewards"] == [1.0] and reply["extra_logs"]["format_ok"] == [1.0]


def test_slime_reward_as_its_client_sends_it(served):
    right = _post(f"{served.url}/reward", {"prompt": "1/2 as a decimal?", "response": "\\boxed{0.5}",
                                           "label": "\\frac{1}{2}"})
    wrong = _post(f"{served.url}/reward", {"prompt": [{"role": "user", "content": "1+2?"}],
                                           "response": "\\boxed{4}", "label": "3"})
    assert (right, wrong) == (1.0, 0.0)


def test_v1_score_is_the_json_form_of_score_and_score_batch(served):
    items = [score_request("boxed", "\\boxed{(1,2)}, \\boxed{(2,1)}", "(2,1), (1,2)", id="a"),
             score_request("think_answer_tags", "<think>x</think><answer>3</answer>", "4", id="b"),
             score_request("boxed", "nothing boxed", "1", id="c")]
    with RewardClient(ClientConfig(address=served.address, timeout_seconds=120)) as client:
        over_grpc = client.score_batch(items)
    batch = _post(f"{served.url}/v1/score", {"items": [
        {"id": "a", "verifier": "boxed", "response": "\\boxed{(1,2)}, \\boxed{(2,1)}", "gt_answer": "(2,1), (1,2)"},
        {"id": "b", "verifier": "think_answer_tags", "response": "<think>x</think><answer>3</answer>",
         "gtAnswer": "4"},
        {"id": "c", "verifier": "boxed", "response": "nothing boxed", "gt_answer": "1"}]})
    fields = ("id", "reward", "format_ok", "answer_ok", "extracted_answer", "reason")
    assert [{f: r[f] for f in fields} for r in batch["results"]] == [
        {f: getattr(r, f) for f in fields} for r in over_grpc]
    one = _post(f"{served.url}/v1/score", {"verifier": "boxed", "response": "\\boxed{3}", "gt_answer": "3"})
    assert one["reward"] == 1.0 and one["answer_ok"] is True and one["extracted_answer"] == "3"


def test_healthz(served):
    with urllib.request.urlopen(f"{served.url}/healthz", timeout=30) as reply:
        assert reply.status == 200


@pytest.mark.parametrize(
    ("path", "body", "field", "words"),
    [
        ("/v1/score", b"{not json", "body", "not JSON"),
        ("/v1/score", b"[1, 2]", "body", "expected a JSON object"),
        ("/v1/score", b'{"verifier": "boxed", "response": 5, "gt_answer": "1"}', "response", "response field"),
        ("/v1/score", b'{"verifier": "boxed", "respons": "x", "gt_answer": "1"}', "respons", "no field named"),
        ("/v1/score", b'{"items": [{"verifier": "boxed", "response": "x"}]}', "items[0].gt_answer",
         "ground-truth answer"),
        ("/v1/score", b'{"verifier": "nope", "response": "x", "gt_answer": "1"}', "verifier", "unknown verifier"),
        ("/get_reward", b'{"query": "one", "prompts": [], "labels": []}', "query", "expected a list"),
        ("/get_reward", b'{"query": ["a", 2], "prompts": ["", ""], "labels": ["1", "2"]}', "query[1]",
         "expected a string"),
        ("/get_reward", b'{"query": ["a", "b"], "prompts": ["", ""], "labels": ["1"]}', "labels", "1 entries"),
        ("/get_reward", b'{"query": ["a"], "prompts": [""], "labels": [null]}', "labels[0]", "ground-truth"),
        ("/get_reward", b'{"query": ["a"], "prompts": [""], "labels": [["1"]]}', "labels[0]", "expected the answer"),
        ("/get_reward?verifier=nope", b'{"query": ["a"], "prompts": [""], "labels": ["1"]}', "verifier",
         "unknown verifier"),
        ("/reward", b'{"prompt": "p", "response": null, "label": "1"}', "response", "expected a string"),
        ("/reward", b'{"prompt": 3, "response": "x", "label": "1"}', "prompt", "expected text"),
        ("/reward", b'{"prompt": "p", "response": "x"}', "label", "ground-truth"),
    ],
)
def test_bad_input_is_400_naming_the_field(served, path, body, field, words):
    status, error = _refusal(f"{served.url}{path}", data=body)
    assert (status, error["code"], error["field"]) == (400, "INVALID_ARGUMENT", field), error
    assert words in error["message"]


# -- a service with a token, TLS and small limits -----------------------------------------------------------
@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pki")
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .sign(key, hashes.SHA256()))
    (folder / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                       serialization.NoEncryption()))
    return folder / "cert.pem", folder / "key.pem"


@pytest.fixture(scope="module")
def guarded(pki):
    cert, key = pki
    # The token comes from a file, as shipped configs give it: HTTP must read it where gRPC does.
    token_file = pki[0].parent / "token"
    token_file.write_text(TOKEN + "\n")
    with serve_reward("https", **{"server.auth_token_file": token_file, "server.tls.cert": cert,
                                  "server.tls.key": key,
                                  "server.max_message_bytes": 65536, "limits.max_response_bytes": 1000,
                                  "limits.max_pending_items": 2}) as served:
        yield served


@pytest.fixture(scope="module")
def trusted(pki):
    return ssl.create_default_context(cafile=str(pki[0]))


AUTH = {"Authorization": f"Bearer {TOKEN}"}
ONE = {"verifier": "boxed", "response": "\\boxed{1}", "gt_answer": "1"}


def test_same_token_over_http_and_grpc(guarded, trusted, pki):
    status, error = _refusal(f"{guarded.url}/v1/score", payload=ONE, ssl=trusted)
    assert (status, error["code"], error["field"]) == (401, "UNAUTHENTICATED", "Authorization")
    status, _ = _refusal(f"{guarded.url}/v1/score", payload=ONE, ssl=trusted,
                         headers={"Authorization": "Bearer wrong"})
    assert status == 401
    assert _post(f"{guarded.url}/v1/score", ONE, ssl=trusted, headers=AUTH)["answer_ok"] is True
    with urllib.request.urlopen(f"{guarded.url}/healthz", timeout=30, context=trusted) as reply:
        assert reply.status == 200
    tls = TLSConfig(ca=pki[0], server_name="localhost")
    with RewardClient(ClientConfig(address=guarded.address, tls=tls, auth_token=TOKEN)) as client:
        assert client.score("boxed", "\\boxed{1}", "1").answer_ok
    with RewardClient(ClientConfig(address=guarded.address, tls=tls, retry_seconds=0)) as client:
        with pytest.raises(grpc.RpcError) as refused:
            client.score("boxed", "\\boxed{1}", "1")
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_https_only_with_the_services_certificate(guarded):
    with pytest.raises(aiohttp.ClientConnectorCertificateError):
        _post(f"{guarded.url}/v1/score", ONE, headers=AUTH)
    with pytest.raises(aiohttp.ClientError):
        _post(guarded.url.replace("https://", "http://") + "/v1/score", ONE, headers=AUTH)


def test_oversized_body_and_fields_are_413_naming_them(guarded, trusted):
    status, error = _refusal(f"{guarded.url}/v1/score", data=b'{"response": "' + b"x" * 70_000 + b'"}',
                             headers=AUTH, ssl=trusted)
    assert (status, error["code"], error["field"]) == (413, "RESOURCE_EXHAUSTED", "body")
    assert "server.max_message_bytes" in error["message"]
    status, error = _refusal(f"{guarded.url}/get_reward", ssl=trusted, headers=AUTH,
                             payload={"query": ["ok", "y" * 1001], "prompts": ["", ""], "labels": ["1", "2"]})
    assert (status, error["code"], error["field"]) == (413, "RESOURCE_EXHAUSTED", "query[1]")
    status, error = _refusal(f"{guarded.url}/reward", ssl=trusted, headers=AUTH,
                             payload={"prompt": "", "response": "y" * 1001, "label": "1"})
    assert (status, error["field"]) == (413, "response")


def _queue_depth(metrics_port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=30) as reply:
        for line in reply.read().decode().splitlines():
            if line.startswith("zerobubble_reward_queue_depth "):
                return float(line.split()[1])
    raise AssertionError("no queue depth gauge")


def test_backlog_full_is_429_at_once_and_accepted_work_completes(guarded, trusted, pki):
    status, error = _refusal(f"{guarded.url}/v1/score", ssl=trusted, headers=AUTH, payload={"items": [ONE] * 3})
    assert (status, error["code"]) == (429, "RESOURCE_EXHAUSTED")
    assert "limits.max_pending_items" in error["message"]
    tls = TLSConfig(ca=pki[0], server_name="localhost")
    with RewardClient(ClientConfig(address=guarded.address, tls=tls, auth_token=TOKEN)) as client:
        verifiers = {v.name: v for v in client.list_verifiers().verifiers}
    if not verifiers["code"].available:
        pytest.skip(f"needs a program that runs for a while: {verifiers['code'].unavailable_reason}")
    # One slow program holds one of the two places while a batch of two is refused.
    slow = {"verifier": "code", "response": "```python\nimport time\ntime.sleep(4)\nprint(1)\n```",
            "test_cases": {"inputs": [""], "outputs": ["1"]}}
    outcome = {}
    first = threading.Thread(target=lambda: outcome.update(
        reply=_post(f"{guarded.url}/v1/score", slow, ssl=trusted, headers=AUTH)))
    first.start()
    deadline = time.monotonic() + 60
    while _queue_depth(guarded.metrics_port) < 1:
        assert time.monotonic() < deadline and first.is_alive(), outcome
        time.sleep(0.05)
    status, error = _refusal(f"{guarded.url}/v1/score", ssl=trusted, headers=AUTH, payload={"items": [ONE] * 2})
    first.join(120)
    assert status == 429
    assert outcome["reply"]["answer_ok"] is True
