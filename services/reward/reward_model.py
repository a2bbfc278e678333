"""The `reward_model` verifier: a Hugging Face sequence-classification model with one output scores prompt +
response, as OpenRLHF's reward-model server (openrlhf/cli/serve_rm.py) does: the text as one string, tokenized
without added special tokens, left-padded, batched, the score read at the last token.

Items wait on a queue; one thread takes up to `batch_size` of them at a time and runs the forward pass, so the
event loops and the other verifiers' lanes never wait on the model. torch and transformers are imported only
here, and only when a reward model is configured.
"""

from __future__ import annotations

import logging
import queue
import threading
from concurrent.futures import Future

from zerobubble.common.config import ConfigError
from zerobubble.reward.config import REWARD_MODEL, RewardModelConfig
from zerobubble.reward.verifiers import ScoreItem, Verdict

log = logging.getLogger(__name__)

_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


class ModelScorer:
    """The model and its tokenizer: score(texts) -> one float each."""

    def __init__(self, config: RewardModelConfig):
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        if config.torch_threads is not None:
            torch.set_num_threads(config.torch_threads)
        self._torch = torch
        device = config.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(config.path)
            self.model = AutoModelForSequenceClassification.from_pretrained(
                config.path, dtype=getattr(torch, _DTYPES[config.dtype])).to(device).eval()
        except (OSError, ValueError) as exc:
            raise ConfigError(f"reward_model.path: cannot load {config.path}: {exc}") from None
        if self.model.config.num_labels != 1:
            raise ConfigError(f"reward_model.path: {config.path} has {self.model.config.num_labels} outputs; a reward "
                              "model has one (num_labels=1)")
        # Left padding puts every sequence's last token at the end; cutting from the left keeps the response's end.
        self.tokenizer.padding_side = "left"
        self.tokenizer.truncation_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        # The model finds each row's last token by the pad id: it must be the tokenizer's.
        self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.device = device
        self.max_length = config.max_length

    def score(self, texts: list[str]) -> list[float]:
        batch = self.tokenizer(texts, return_tensors="pt", add_special_tokens=False, padding=True,
                               truncation=True, max_length=self.max_length).to(self.device)
        with self._torch.inference_mode():
            logits = self.model(**batch).logits
        return logits[:, 0].float().tolist()


class RewardModelVerifier:
    name = REWARD_MODEL
    description = "score of prompt + response by a sequence-classification reward model"
    ground_truth = "none"
    lane = "model"

    def __init__(self, config: RewardModelConfig):
        self.config = config
        self.model = ModelScorer(config)
        self._queue: queue.Queue[tuple[str, Future] | None] = queue.Queue()
        self.batches = 0
        self._thread = threading.Thread(target=self._serve, name="reward-model", daemon=True)
        self._thread.start()

    def check(self, item: ScoreItem) -> Verdict:
        future: Future = Future()
        self._queue.put((item.prompt + item.response, future))
        try:
            score = future.result(timeout=self.config.timeout_seconds)
        except TimeoutError:
            future.cancel()
            return Verdict(format_ok=False, answer_ok=False, reason="timeout")
        except Exception as exc:  # noqa: BLE001 - a failed forward pass is this item's verdict
            return Verdict(format_ok=False, answer_ok=False, reason=f"model_error: {type(exc).__name__}: {exc}")
        answer_ok = score >= self.config.answer_threshold
        return Verdict(format_ok=True, answer_ok=answer_ok, fraction=float(answer_ok), reward=score)

    def _serve(self) -> None:
        while (first := self._queue.get()) is not None:
            work = [first]
            # Whatever is waiting joins the batch; nothing waits for a batch to fill.
            while len(work) < self.config.batch_size:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self._queue.put(None)
                    break
                work.append(more)
            # Items whose callers gave up waiting are not scored.
            work = [(text, future) for text, future in work if future.set_running_or_notify_cancel()]
            if not work:
                continue
            try:
                scores = self.model.score([text for text, _ in work])
            except Exception as exc:  # noqa: BLE001 - handed to every item of the batch
                log.exception("reward model failed on a batch of %d", len(work))
                for _, future in work:
                    future.set_exception(exc)
                continue
            self.batches += 1
            for (_, future), score in zip(work, scores, strict=True):
                future.set_result(score)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=30)
