"""A tiny Qwen2-architecture causal LM with a byte-level tokenizer, written in HF format.

No model can be downloaded where the project runs its tests and demo, so it makes its own: weights are
deterministic from the seed, and the tokenizer is a byte-level BPE with no merges (every byte is one
token), which round-trips any NFC-normalised text exactly and loads in transformers and vLLM alike. (Like
Qwen's own tokenizer it normalises to NFC: AutoTokenizer imposes that on every qwen2 model.)
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX as QWEN2_PRETOKENIZE_REGEX

from zerobubble.tooling.tiny.shapes import SIZES

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (PAD_TOKEN, IM_START, IM_END)

# Qwen's ChatML layout; the caller supplies any system message (no default one is injected).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _byte_vocabulary() -> dict[str, int]:
    """GPT-2's byte table: each byte id 0-255 as the printable character the ByteLevel pre-tokenizer uses.

    Printable bytes stand for themselves; the others are shifted past 255.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    vocabulary = {chr(byte): byte for byte in printable}
    shifted = (byte for byte in range(256) if byte not in printable)
    for offset, byte in enumerate(shifted):
        vocabulary[chr(256 + offset)] = byte
    return vocabulary


def make_tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level BPE over the 256 byte tokens with no merges, plus the three ChatML special tokens."""
    core = Tokenizer(models.BPE(vocab=_byte_vocabulary(), merges=[]))
    # Qwen2's normaliser and pre-tokeniser: AutoTokenizer rebuilds a qwen2 model's tokenizer with these
    # whatever the files say, so the in-memory tokenizer is made to match what every reload gives.
    core.normalizer = normalizers.NFC()
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(list(SPECIAL_TOKENS))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        additional_special_tokens=[IM_START],
        model_max_length=4096,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def tiny_config(size: str, tokenizer: PreTrainedTokenizerFast) -> Qwen2Config:
    if size not in SIZES:
        raise ValueError(f"unknown tiny model size {size!r}; choose one of {', '.join(SIZES)}")
    shape = SIZES[size]
    return Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        intermediate_size=shape.intermediate,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.convert_tokens_to_ids(PAD_TOKEN),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )


def make_tiny_model(out_dir: Path, *, size: str = "2m", seed: int = 0) -> Path:
    """Write a randomly initialised tiny Qwen2 model and its tokenizer to out_dir; return out_dir."""
    out_dir = Path(out_dir)
    tokenizer = make_tokenizer()
    config = tiny_config(size, tokenizer)
    # A private generator state, so the weights depend on the seed only and the caller's RNG is untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=config.bos_token_id,
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def parameter_count(model: torch.nn.Module) -> int:
    """Distinct parameters (tied embeddings counted once)."""
    return sum(parameter.numel() for parameter in model.parameters())
