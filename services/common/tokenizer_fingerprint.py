"""What a token id means, as one string: two processes that exchange ids (a student and its teacher) must agree on
it before the first id crosses. Torch-free; it reads any Hugging Face tokenizer it is given."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """sha256 of the id -> token table, added and special tokens included. Only that table: two tokenizers that
    split text differently but name every id alike agree on ids, which is all a teacher scoring ids needs."""
    table = sorted((index, token) for token, index in tokenizer.get_vocab().items())
    return hashlib.sha256(json.dumps(table, ensure_ascii=False).encode()).hexdigest()


def tokenizer_name(tokenizer: Any, source: object) -> str:
    """A name for messages: where the tokenizer came from and its size."""
    return f"{source} ({len(tokenizer)} tokens)"
