"""Trainer strategy test helpers: a tiny Qwen2 model folder, a byte-level tokenizer, spawned data-parallel ranks."""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from zerobubble.tooling.ports import free_port
from zerobubble.trainer.optim import OptimConfig
from zerobubble.trainer.strategies import StrategyConfig

VOCAB = 260  # 256 bytes and 4 special tokens


def make_tokenizer(directory: Path) -> None:
    """A byte-level BPE with the 256 byte tokens and no merges (round-trips any text exactly)."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {symbol: i for i, symbol in enumerate(sorted(alphabet))}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>", pad_token="<|pad|>")
    fast.save_pretrained(directory)


def make_tiny_model(directory: Path, seed: int = 0) -> Path:
    """A ~40k-parameter Qwen2ForCausalLM (tied embeddings, 2 layers) with its tokenizer, saved in HF format."""
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    Qwen2ForCausalLM(config).save_pretrained(directory)
    make_tokenizer(directory)
    return directory


def strategy_config(**optim: Any) -> StrategyConfig:
    # A large Adam eps: the key bias's gradient is zero in exact arithmetic (softmax ignores it), and with a
    # tiny eps Adam would blow its rounding noise up to full-lr steps that differ between equal computations.
    settings = {"lr": 1e-2, "eps": 1e-4, "weight_decay": 0.0, "max_grad_norm": 1.0} | optim
    return StrategyConfig(device="cpu", optim=OptimConfig(**settings))


def token_batch(seed: int, rows: int = 2, length: int = 12) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (rows, length), generator=generator)


def summed_nll(model: torch.nn.Module, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The summed next-token negative log-likelihood of `tokens` and how many tokens it covers."""
    logits = model(input_ids=tokens, attention_mask=torch.ones_like(tokens)).logits[:, :-1].float()
    nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1),
                                            reduction="sum")
    return nll, torch.tensor(float(tokens[:, 1:].numel()))


def _rank_entry(rank: int, world_size: int, port: int, target: Callable[..., Any], args: tuple) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world_size),
                      RANK=str(rank), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    target(rank, *args)


def run_ranks(target: Callable[..., Any], world_size: int, *args: Any) -> None:
    """Runs target(rank, *args) in `world_size` spawned processes joined by env:// (gloo); raises if one fails."""
    mp.start_processes(_rank_entry, args=(world_size, free_port(), target, args), nprocs=world_size,
                       join=True, start_method="spawn")


def train_rank(rank: int, model_dir: Path, out_dir: Path) -> None:
    """One data-parallel rank: two updates on its own batches with the globally normalised loss, a checkpoint,
    a third update, a load of the checkpoint and the third update again; what it saw is saved for the test."""
    from zerobubble.trainer.checkpoints import Checkpoints, TrainerState
    from zerobubble.trainer.strategies import make_strategy

    def update(strategy, step: int):
        nll, count = summed_nll(strategy.model, token_batch(seed=100 * step + rank))
        strategy.backward(nll / strategy.all_reduce_sum(count))
        return strategy.step()

    def local_weights(strategy) -> dict[str, torch.Tensor]:
        return {name: p.detach().to_local().clone() for name, p in strategy.model.named_parameters()}

    torch.manual_seed(1000 + rank)  # distinct RNG streams, so restoring each rank's own one is visible
    strategy = make_strategy(strategy_config(), model_dir)
    results = [update(strategy, step) for step in range(2)]
    full = dict(strategy.full_state_dict())
    saved = local_weights(strategy)
    checkpoints = Checkpoints(out_dir / "checkpoints", keep=2)
    checkpoints.save(strategy, TrainerState(step=2, policy_version=2, buffer_delivery=7, extra={"rank_seen": 2}))
    draw_after_save = torch.rand(3)
    third = update(strategy, 2)
    third_weights = local_weights(strategy)
    state = checkpoints.load(strategy)
    restored = local_weights(strategy)
    draw_after_load = torch.rand(3)
    third_again = update(strategy, 2)
    torch.save({
        "world_size": strategy.world_size,
        "results": results,
        "full": full,
        "rank_sum": strategy.all_reduce_sum(torch.tensor([rank + 1.0])),
        "saved": saved,
        "restored": restored,
        "state": state,
        "draws": (draw_after_save, draw_after_load),
        "third": (third, third_again),
        "third_weights": (third_weights, local_weights(strategy)),
    }, out_dir / f"rank{rank}.pt")
    strategy.close()


@functools.cache
def two_rank_run() -> tuple[dict[str, Any], dict[str, Any]]:
    """`train_rank` on two spawned gloo ranks, run once per test session (spawning is the slow part);
    what each rank saved, plus `run_dir` (model and checkpoints) in the first."""
    run_dir = Path(tempfile.mkdtemp(prefix="zb-fsdp-"))
    atexit.register(shutil.rmtree, run_dir, ignore_errors=True)
    model_dir = make_tiny_model(run_dir / "model")
    run_ranks(train_rank, 2, model_dir, run_dir)
    ranks = tuple(torch.load(run_dir / f"rank{rank}.pt", weights_only=False) for rank in range(2))
    ranks[0]["run_dir"] = run_dir
    return ranks
