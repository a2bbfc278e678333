"""The frozen teacher model: per-token log-probs of given ids. torch and transformers are imported here only."""

from __future__ import annotations

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from zerobubble.common.config import ConfigError
from zerobubble.common.tokenizer_fingerprint import tokenizer_fingerprint, tokenizer_name
from zerobubble.teacher.config import TeacherModelConfig

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class TeacherModel:
    def __init__(self, config: TeacherModelConfig):
        if config.torch_threads is not None:
            torch.set_num_threads(config.torch_threads)
        device = config.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        try:
            tokenizer = AutoTokenizer.from_pretrained(config.path)
            self.model = AutoModelForCausalLM.from_pretrained(config.path, dtype=_DTYPES[config.dtype]).to(device)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"model.path: cannot load {config.path}: {exc}") from None
        self.model.eval().requires_grad_(False)
        self.device = torch.device(device)
        self.path = str(config.path)
        self.fingerprint = tokenizer_fingerprint(tokenizer)
        self.tokenizer_name = tokenizer_name(tokenizer, config.path)
        # The output layer's width: ids at or above it have no logit (a tokenizer may name fewer ids than the
        # embedding holds rows, never more).
        self.vocab_size = int(self.model.get_output_embeddings().weight.shape[0])
        self.max_positions = getattr(self.model.config, "max_position_embeddings", None)

    @torch.inference_mode()
    def logprobs(self, sequences: list[tuple[np.ndarray, int]]) -> list[np.ndarray]:
        """log p(ids[t] | ids[:t]) for t in score_from..len-1 of each (ids, score_from), in one forward pass.
        Right padding: each sequence's positions and attention are those it would have alone."""
        width = max(len(ids) for ids, _ in sequences)
        input_ids = torch.zeros((len(sequences), width), dtype=torch.long)
        attention = torch.zeros((len(sequences), width), dtype=torch.long)
        for row, (ids, _) in enumerate(sequences):
            input_ids[row, :len(ids)] = torch.from_numpy(ids.astype(np.int64))
            attention[row, :len(ids)] = 1
        logits = self.model(input_ids=input_ids.to(self.device), attention_mask=attention.to(self.device)).logits
        out = []
        for row, (ids, start) in enumerate(sequences):
            # Position t - 1 predicts token t; only the scored positions are normalised (a vocabulary of 150k
            # makes full log-softmaxes the memory of the pass).
            scored = logits[row, start - 1:len(ids) - 1].float().log_softmax(dim=-1)
            targets = input_ids[row, start:len(ids)].to(self.device)
            out.append(scored.gather(1, targets[:, None]).squeeze(1).cpu().numpy())
        return out
