"""The training clients: LoRA adapters, one per client, on one frozen base model, each with its own Adam state.

peft holds every adapter in the one model; a call activates its client's adapter, so the others are neither in its
forward pass nor reached by its backward pass, and each client's optimizer holds only its own adapter's parameters.
Gradients stay on a client's parameters from its forward_backward calls until its optim_step, whatever other
clients run in between. Log-probs are the trainer's own (trainer/algorithms/logprobs.py), the losses losses.py's.
Everything here runs on the front's one worker thread (futures.py)."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM

from zerobubble.tooling.tinker import losses
from zerobubble.tooling.tinker.errors import Refused, invalid, unknown
from zerobubble.tooling.tinker.schema import AdamParams, Lora
from zerobubble.tooling.tinker.wire import ForwardBackwardCall, encode_forward_backward
from zerobubble.trainer.algorithms.logprobs import token_logprobs_and_entropy
from zerobubble.trainer.lora import adapter_weights, peft_config, wrap
from zerobubble.trainer.lora_config import LoraConfig
from zerobubble.trainer.optim import clip_gradients

ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
MLP = ["gate_proj", "up_proj", "down_proj"]


@dataclass
class TrainingModel:
    session_id: str
    adapter: str                          # peft's name of its adapter
    lora: LoraConfig
    parameters: list[torch.nn.Parameter]
    optimizer: torch.optim.AdamW | None = None
    steps: int = 0


@dataclass(frozen=True)
class SavedState:
    """A training client's adapter and Adam state as save_state kept them (copies: later steps change nothing)."""

    lora: LoraConfig
    parameters: list[torch.Tensor]
    optimizer: dict | None                # AdamW's state_dict; None before the first optim_step
    steps: int


class TrainingModels:
    def __init__(self, model_dir: Path, *, max_models: int, max_rank: int, alpha: float, max_tokens: int):
        self.base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.context_length = int(getattr(self.base.config, "max_position_embeddings", 0) or 0)
        self.vocabulary = int(self.base.config.vocab_size)
        self.peft = None
        self.models: dict[str, TrainingModel] = {}
        self._created = 0
        self._max_models, self._max_rank, self._alpha, self._max_tokens = max_models, max_rank, alpha, max_tokens

    def check_create(self, lora: Lora | None) -> LoraConfig:
        """The adapter's settings for a create_model request; refused at once when it cannot be served."""
        if lora is None:
            raise invalid("lora_config", "only LoRA training clients are served (full fine-tuning is not)")
        if lora.rank > self._max_rank:
            raise invalid("lora_config.rank", f"{lora.rank} is over max_lora_rank={self._max_rank}")
        targets = (ATTENTION if lora.train_attn else []) + (MLP if lora.train_mlp else [])
        if not targets:
            raise invalid("lora_config", "train_attn or train_mlp must be set (the unembedding is not adapted)")
        self.check_room()
        return LoraConfig(rank=lora.rank, alpha=self._alpha, target_modules=targets)

    def check_room(self) -> None:
        if len(self.models) >= self._max_models:
            raise Refused(403, "max_models", f"{len(self.models)} training clients are held, the most this server "
                          "holds; unload one first")

    def create(self, model_id: str, session_id: str, config: LoraConfig, seed: int | None) -> dict:
        adapter = f"client{self._created}"
        self._created += 1
        # The adapter's initial A is drawn from its own seed, so two clients with one seed start alike.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed if seed is not None else self._created)
            if self.peft is None:
                self.peft = wrap(self.base, config, adapter_name=adapter)
            else:
                self.peft.add_adapter(adapter, peft_config(config))
        marker = f".{adapter}."
        parameters = [p for name, p in self.peft.named_parameters() if marker in name]
        self.models[model_id] = TrainingModel(session_id, adapter, config, parameters)
        return {"model_id": model_id, "type": "create_model"}

    def get(self, model_id: str) -> TrainingModel:
        model = self.models.get(model_id)
        if model is None:
            raise unknown("model_id", model_id)
        return model

    def unload(self, model_id: str) -> dict:
        model = self.models.pop(model_id)
        self.peft.delete_adapter(model.adapter)
        return {"model_id": model_id, "type": "unload_model"}

    def check_forward_backward(self, call: ForwardBackwardCall):
        """Everything about a forward_backward that can be refused, refused before it is queued."""
        self.get(call.model_id)
        surrogate = losses.check_config(call.loss_fn, call.loss_fn_config)
        if not call.data:
            raise invalid("data", "no data")
        total = 0
        for i, datum in enumerate(call.data):
            length = datum.tokens.size
            total += length
            if not length:
                raise invalid(f"data[{i}].model_input", "no tokens")
            if self.context_length and length > self.context_length:
                raise invalid(f"data[{i}].model_input", f"{length} tokens is over the model's context of "
                              f"{self.context_length}")
            if int(datum.tokens.min()) < 0 or int(datum.tokens.max()) >= self.vocabulary:
                raise invalid(f"data[{i}].model_input", f"a token id outside the vocabulary [0, {self.vocabulary})")
            for name in ("target_tokens", *losses.INPUTS[call.loss_fn]):
                values = datum.inputs.get(name)
                field = f"data[{i}].loss_fn_inputs.{name}"
                if values is None:
                    raise invalid(field, f"missing ({call.loss_fn} needs it)")
                if values.size != length:
                    raise invalid(field, f"{values.size} values for {length} input tokens")
                if values.dtype.kind == "f" and not np.isfinite(values).all():
                    raise invalid(field, "not finite")
            targets = datum.inputs["target_tokens"]
            if targets.dtype.kind != "i" or int(targets.min()) < 0 or int(targets.max()) >= self.vocabulary:
                raise invalid(f"data[{i}].loss_fn_inputs.target_tokens", "must be token ids in the vocabulary")
        if total > self._max_tokens:
            raise invalid("data", f"{total} tokens is over max_tokens_per_request={self._max_tokens}")
        return surrogate

    def forward_backward(self, call: ForwardBackwardCall, surrogate) -> bytes:
        model = self.get(call.model_id)
        self.peft.set_adapter(model.adapter)
        count, width = len(call.data), max(datum.tokens.size for datum in call.data)
        ids = torch.zeros((count, width), dtype=torch.long)
        targets = torch.zeros((count, width), dtype=torch.long)
        mask = torch.zeros((count, width), dtype=torch.bool)
        inputs = {name: torch.zeros((count, width)) for name in losses.INPUTS[call.loss_fn]}
        for i, datum in enumerate(call.data):
            length = datum.tokens.size
            ids[i, :length] = torch.from_numpy(datum.tokens)
            targets[i, :length] = torch.from_numpy(datum.inputs["target_tokens"].astype(np.int64))
            mask[i, :length] = True
            for name, tensor in inputs.items():
                tensor[i, :length] = torch.from_numpy(datum.inputs[name].astype(np.float32))
        with torch.set_grad_enabled(not call.forward_only):
            logits = self.peft(input_ids=ids, attention_mask=mask.long()).logits
            # Position t's logits score target t: the trainer's response log-probs with the response starting at
            # column 1 of [first input token, targets...].
            ones = torch.ones(count, dtype=torch.long)
            logp = token_logprobs_and_entropy(logits, torch.cat([ids[:, :1], targets], dim=1), ones, mask,
                                              ones.float(), with_entropy=False).logprobs
            per_token = losses.per_token_loss(call.loss_fn, logp, inputs, surrogate, mask)
            loss = per_token.sum()
            if not call.forward_only:
                loss.backward()
        lengths = [datum.tokens.size for datum in call.data]
        outputs = {"logprobs": [logp[i, :n].detach().numpy() for i, n in enumerate(lengths)],
                   "elementwise_loss": [per_token[i, :n].detach().numpy() for i, n in enumerate(lengths)]}
        return encode_forward_backward(outputs, {"loss:sum": float(loss)}, count)

    def optim_step(self, model_id: str, adam: AdamParams) -> dict:
        model = self.get(model_id)
        settings = {"lr": adam.learning_rate, "betas": (adam.beta1, adam.beta2), "eps": adam.eps,
                    "weight_decay": adam.weight_decay}
        if model.optimizer is None:
            model.optimizer = torch.optim.AdamW(model.parameters, **settings)
        else:
            model.optimizer.param_groups[0].update(settings)
        norm = clip_gradients(model.parameters, adam.grad_clip_norm or None)
        model.optimizer.step()
        model.optimizer.zero_grad(set_to_none=True)
        model.steps += 1
        return {"metrics": {"grad_norm:mean": norm, "step:max": float(model.steps)}}

    def save_state(self, model_id: str) -> SavedState:
        model = self.get(model_id)
        optimizer = copy.deepcopy(model.optimizer.state_dict()) if model.optimizer is not None else None
        return SavedState(model.lora, [p.detach().clone() for p in model.parameters], optimizer, model.steps)

    def load_state(self, model_id: str, state: SavedState, with_optimizer: bool) -> None:
        """The saved adapter into the client's own (the same LoRA settings), and its Adam state or a fresh one;
        gradients not yet stepped are dropped."""
        model = self.get(model_id)
        if (model.lora.rank, model.lora.target_modules) != (state.lora.rank, state.lora.target_modules):
            raise invalid("path", f"the checkpoint's adapter (rank {state.lora.rank}, {state.lora.target_modules}) "
                          f"is not this client's (rank {model.lora.rank}, {model.lora.target_modules})")
        with torch.no_grad():
            for parameter, saved in zip(model.parameters, state.parameters, strict=True):
                parameter.copy_(saved)
                parameter.grad = None
        model.optimizer = None
        if with_optimizer and state.optimizer is not None:
            model.optimizer = torch.optim.AdamW(model.parameters)
            model.optimizer.load_state_dict(copy.deepcopy(state.optimizer))
        model.steps = state.steps if with_optimizer else 0

    def adapter(self, model_id: str) -> list[tuple[str, torch.Tensor]]:
        """A copy of the client's adapter as the weight sync sends it (common/lora_adapter.py)."""
        model = self.get(model_id)
        return [(name, tensor.clone()) for name, tensor in adapter_weights(self.peft, model.adapter)]
