"""On-policy distillation worked by hand through the trainer's real update: the teacher's log-probs come from a real
teacher service over the socket, each token's advantage is -coef (log p_student - log p_teacher), alone (DISTILL)
or added to GRPO's, and the step's loss and reverse-KL figure are what the formulas give."""

from __future__ import annotations

import json
import logging
import math
import threading

import grpc
import pytest
import torch
from behaviour_cases import GENERATIONS, GROUPS, behaviour_groups, own_logprobs
from strategy_helpers import make_tiny_model, strategy_config
from transformers import AutoModelForCausalLM, AutoTokenizer

from zerobubble.common.clients.teacher import TeacherClient
from zerobubble.common.config import ClientConfig, ConfigError, load_config
from zerobubble.common.persistence import Stopped
from zerobubble.common.tokenizer_fingerprint import tokenizer_fingerprint, tokenizer_name
from zerobubble.teacher.app import build as build_teacher
from zerobubble.teacher.config import TeacherServiceConfig
from zerobubble.tooling.ports import free_port
from zerobubble.trainer.algorithms import algorithm_config
from zerobubble.trainer.collate import collate
from zerobubble.trainer.config import TrainerServiceConfig
from zerobubble.trainer.strategies import make_strategy
from zerobubble.trainer.teacher_scores import TeacherContext, TeacherScores
from zerobubble.trainer.update import PolicyUpdate, UpdateSettings

SHIFT = 0.1   # behaviour log-probs 0.1 under the student's own: behaviour weight e^0.1 on every token
# A chat template short enough for the test model's 64 positions: each message's role and content on a line.
TEMPLATE = ("{% for m in messages %}{{ m.role[0] }}:{{ m.content }}\n{% endfor %}"
            "{% if add_generation_prompt %}a:{% endif %}")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("distill")
    return make_tiny_model(root / "student", seed=0), make_tiny_model(root / "teacher", seed=1)


@pytest.fixture(scope="module")
def teacher_scores(models):
    student, teacher = models
    host = build_teacher(load_config(TeacherServiceConfig, None, {
        "server.listen": "127.0.0.1:0", "server.metrics_port": None, "model.path": str(teacher)})).start()
    client = teacher_client(host.address, student, retry_seconds=10.0, retries=True)
    yield TeacherScores(client)
    client.close()
    host.stop(grace=0)


def teacher_client(address, student, retry_seconds, retries=False):
    """The trainer's client of a teacher: its tokenizer the student's, waiting up to retry_seconds for one down."""
    tokenizer = AutoTokenizer.from_pretrained(student)
    return TeacherClient(ClientConfig(address=address, timeout_seconds=10.0, retry_seconds=retry_seconds),
                         tokenizer_fingerprint(tokenizer), tokenizer_name(tokenizer, student), retries=retries)


def step(student, algorithm, scores, batch):
    with make_strategy(strategy_config(), student) as strategy:
        update = PolicyUpdate(strategy, algorithm, UpdateSettings(1, 8, max_new_tokens=8), teacher=scores)
        return update(batch, 0), update.sample_advantages(batch)


def test_distillation_alone_trains_each_token_towards_the_teacher_with_the_hand_computed_loss(models, teacher_scores):
    student, teacher = models
    batch = collate(behaviour_groups(student, SHIFT), pad_id=0)
    figures, per_sample = step(student, algorithm_config("DISTILL"), teacher_scores, batch)
    mask = batch.response_mask.bool()
    # By hand: the teacher's log-probs from a plain forward of the teacher model; the student's are the behaviour
    # log-probs the samples carry (own - SHIFT).
    reverse_kl = batch.behaviour_logprobs.double() - own_logprobs(teacher, batch)
    advantages = torch.where(mask, -1.0 * reverse_kl, 0.0)
    # One update from the weights that drew the samples: ratio 1 on every token, so the clipped surrogate is
    # -w A with the behaviour weight w = pi_old / pi_behaviour = e^SHIFT; DISTILL's token-level mean.
    expected = (-math.exp(SHIFT) * advantages).sum() / mask.sum()
    assert figures["loss"] == pytest.approx(float(expected), abs=1e-5)
    assert figures["teacher_reverse_kl"] == pytest.approx(float(reverse_kl[mask].mean()), abs=1e-5)
    # The verifier's reward plays no part: the rewards differ within each group, the advantages do not follow them.
    assert per_sample == pytest.approx((advantages.sum(1) / mask.sum(1)).tolist(), abs=1e-5)


def test_centred_distillation_subtracts_the_batchs_mean_log_ratio_from_each_token(models, teacher_scores):
    student, teacher = models
    batch = collate(behaviour_groups(student, SHIFT), pad_id=0)
    figures, per_sample = step(student, algorithm_config("DISTILL", distillation_centred=True), teacher_scores,
                               batch)
    mask = batch.response_mask.bool()
    log_ratio = batch.behaviour_logprobs.double() - own_logprobs(teacher, batch)
    centred = torch.where(mask, -(log_ratio - log_ratio[mask].mean()), 0.0)
    assert per_sample == pytest.approx((centred.sum(1) / mask.sum(1)).tolist(), abs=1e-5)
    uncentred = torch.where(mask, -log_ratio, 0.0)
    plain = (uncentred.sum(1) / mask.sum(1)).tolist()
    assert max(abs(a - b) for a, b in zip(per_sample, plain, strict=True)) > 1e-2
    # Token-level mean at ratio 1: the centred advantages sum to zero over the trained tokens, so does the loss.
    assert figures["loss"] == pytest.approx(float((-math.exp(SHIFT) * centred).sum() / mask.sum()), abs=1e-5)
    assert abs(figures["loss"]) < 1e-5
    # The figure stays the estimate of the reverse KL itself, not of the centred term.
    assert figures["teacher_reverse_kl"] == pytest.approx(float(log_ratio[mask].mean()), abs=1e-5)


def test_discounted_distillation_charges_each_token_the_log_ratios_after_it(models, teacher_scores):
    student, teacher = models
    batch = collate(behaviour_groups(student, SHIFT), pad_id=0)
    gamma = 0.5
    figures, per_sample = step(student, algorithm_config("DISTILL", distillation_discount=gamma), teacher_scores,
                               batch)
    mask = batch.response_mask.bool()
    log_ratio = torch.where(mask, batch.behaviour_logprobs.double() - own_logprobs(teacher, batch), 0.0)
    # By hand, a double loop: token t carries sum over u >= t of gamma^(u - t) times token u's log-ratio.
    rows, width = log_ratio.shape
    discounted = torch.zeros_like(log_ratio)
    for i in range(rows):
        for t in range(width):
            discounted[i, t] = sum(gamma ** (u - t) * log_ratio[i, u] for u in range(t, width))
    advantages = torch.where(mask, -discounted, 0.0)
    assert per_sample == pytest.approx((advantages.sum(1) / mask.sum(1)).tolist(), abs=1e-5)
    assert figures["loss"] == pytest.approx(float((-math.exp(SHIFT) * advantages).sum() / mask.sum()), abs=1e-5)
    own_only = torch.where(mask, -log_ratio, 0.0)
    assert (advantages - own_only).abs().max() > 1e-2, "the case must tell the discounted sum from each token's own"


def test_distillation_added_to_the_verifiers_advantage(models, teacher_scores):
    student, teacher = models
    batch = collate(behaviour_groups(student, SHIFT), pad_id=0)
    coef = 0.5
    figures, _ = step(student, algorithm_config("GRPO", beta=0.0, distillation_coef=coef), teacher_scores, batch)
    mask = batch.response_mask.bool()
    rewards = batch.rewards.reshape(GROUPS, GENERATIONS).double()
    grpo = ((rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-4)).reshape(-1, 1)
    distill = -coef * (batch.behaviour_logprobs.double() - own_logprobs(teacher, batch))
    per_token = torch.where(mask, -math.exp(SHIFT) * (grpo + distill), 0.0)
    # GRPO's sample-level mean: each sample's token mean, then the mean over samples.
    expected = (per_token.sum(1) / mask.sum(1)).mean()
    assert figures["loss"] == pytest.approx(float(expected), abs=1e-5)
    without = (torch.where(mask, -math.exp(SHIFT) * grpo.expand_as(mask), 0.0).sum(1) / mask.sum(1)).mean()
    assert abs(float(expected - without)) > 1e-2, "the case must tell the distillation term from its absence"


def test_distillation_without_a_teacher_is_refused_naming_the_field(models):
    with pytest.raises(ConfigError, match=r"algorithm.distillation_coef: distillation needs a teacher"):
        load_config(TrainerServiceConfig, None, {"model": str(models[0]), "algorithm.preset": "DISTILL"})
    with pytest.raises(ConfigError, match="reward_advantage false leaves no advantage"):
        algorithm_config("GRPO", reward_advantage=False)
    assert load_config(TrainerServiceConfig, None, {"model": str(models[0]), "algorithm.preset": "DISTILL",
                                                    "teacher.address": "127.0.0.1:1"}).teacher is not None


def start_teacher_at(model, listen: str):
    return build_teacher(load_config(TeacherServiceConfig, None, {
        "server.listen": listen, "server.metrics_port": None, "server.grace_seconds": 0, "model.path": str(model)})
    ).start()


def test_a_teacher_down_mid_run_is_waited_for_with_backoff_and_said_so(models, caplog):
    student, teacher = models
    batch = collate(behaviour_groups(student, SHIFT), pad_id=0)
    listen = f"127.0.0.1:{free_port()}"
    host = start_teacher_at(teacher, listen)
    client = teacher_client(listen, student, retry_seconds=30.0)
    client.connect()
    host.stop(grace=0)
    back = []
    restart = threading.Timer(1.5, lambda: back.append(start_teacher_at(teacher, listen)))
    restart.start()
    try:
        with caplog.at_level(logging.WARNING, logger="zerobubble.common.persistence"):
            scores = TeacherScores(client)(batch)
    finally:
        restart.join()
        for started in back:
            started.stop(grace=0)
    mask = batch.response_mask.bool()
    assert scores[mask].double().tolist() == pytest.approx(own_logprobs(teacher, batch)[mask].tolist(), abs=1e-5)
    assert f"teacher log-probs ({listen}): UNAVAILABLE" in caplog.text, "the wait is said in the log, naming whom"

    # Down for longer than the client's retry_seconds: the step fails with the teacher's status; close() ends a
    # wait at once.
    impatient = teacher_client(listen, student, retry_seconds=0.5)
    impatient.limits = client.limits
    with pytest.raises(grpc.RpcError) as caught:
        TeacherScores(impatient)(batch)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    stopped = TeacherScores(client)
    stopped.close()
    with pytest.raises(Stopped):
        stopped(batch)
    impatient.close()
    client.close()


def test_each_sample_is_scored_by_its_data_sources_teacher(models, tmp_path):
    student, teacher = models
    other = make_tiny_model(tmp_path / "other-teacher", seed=2)
    groups = behaviour_groups(student, SHIFT)
    groups[1].prompt.data_source = "apps"   # group 0 names no source: the default teacher's
    batch = collate(groups, pad_id=0)
    hosts = [start_teacher_at(model, "127.0.0.1:0") for model in (teacher, other)]
    clients = [teacher_client(host.address, student, retry_seconds=5.0) for host in hosts]
    try:
        scores = TeacherScores(clients[0], {"apps": clients[1], "gsm8k": clients[0]})(batch)
    finally:
        for client, host in zip(clients, hosts, strict=True):
            client.close()
            host.stop(grace=0)
    mask = batch.response_mask.bool()
    routed = torch.cat([own_logprobs(teacher, batch)[:GENERATIONS], own_logprobs(other, batch)[GENERATIONS:]])
    assert scores[mask].double().tolist() == pytest.approx(routed[mask].tolist(), abs=1e-5)
    # The two teachers disagree: the case tells a routed sample from one left with the default.
    assert (own_logprobs(teacher, batch) - own_logprobs(other, batch))[mask].abs().max() > 1e-2


def test_routes_without_a_default_teacher_are_refused_naming_the_field(models):
    student, _ = models
    with pytest.raises(ConfigError, match="teachers_by_data_source: the samples of other data sources"):
        load_config(TrainerServiceConfig, None, {"model": str(student), "teachers_by_data_source.apps.address":
                                                 "127.0.0.1:1"})


def test_a_self_distilling_teacher_scores_the_sampled_tokens_after_the_row_and_its_answer(models, tmp_path):
    """The student's own model as the teacher, seeing the row with 'A={answer}' added: its log-probs are those of a
    plain forward of the student over the hand-written prompt with the answer, then the very response ids sampled
    (never re-encoded)."""
    student, _ = models
    groups = behaviour_groups(student, SHIFT)
    rows = [("2+5=", "7"), ("9-4=", "5")]
    for group, (question, answer) in zip(groups, rows, strict=True):
        group.prompt.messages_json = json.dumps([{"role": "user", "content": question}])
        group.prompt.gt_answer = answer
    batch = collate(groups, pad_id=0)
    host = start_teacher_at(student, "127.0.0.1:0")
    client = teacher_client(host.address, student, retry_seconds=5.0)
    tokenizer = AutoTokenizer.from_pretrained(student)
    # This test model's tokenizer has no chat template; the trainer's comes with its model.
    tokenizer.chat_template = TEMPLATE
    try:
        scores = TeacherScores(client, context=TeacherContext(tokenizer, "A={answer}"))(batch)
    finally:
        client.close()
        host.stop(grace=0)
    model = AutoModelForCausalLM.from_pretrained(student)
    mask = batch.response_mask.bool()
    for row, (sequence, prompt_length) in enumerate(zip(batch.sequences, batch.prompt_lengths, strict=True)):
        question, answer = rows[row // GENERATIONS]
        prompt = tokenizer.encode(f"u:{question}\n\nA={answer}\na:", add_special_tokens=False)
        response = sequence[int(prompt_length):]
        ids = torch.cat([torch.tensor(prompt), response])[None]
        with torch.no_grad():
            logp = torch.log_softmax(model(ids).logits[0, len(prompt) - 1:-1].double(), -1)
        expected = logp.gather(1, response[:, None]).squeeze(1)
        assert scores[row][mask[row]].double().tolist() == pytest.approx(expected.tolist(), abs=1e-5)
    # In the student's own prompt the same model says otherwise: the context is what the teacher adds.
    assert (scores - batch.behaviour_logprobs - SHIFT)[mask].abs().max() > 1e-2


def test_a_teacher_context_naming_another_field_or_without_a_teacher_is_refused(models):
    student, _ = models
    with pytest.raises(ConfigError, match=r"teacher_context: KeyError\('solution'\)"):
        load_config(TrainerServiceConfig, None, {"model": str(student), "teacher.address": "127.0.0.1:1",
                                                 "teacher_context": "Use {solution}."})
    with pytest.raises(ConfigError, match="teacher_context: a context is for a teacher"):
        load_config(TrainerServiceConfig, None, {"model": str(student), "teacher_context": "It is {answer}."})
