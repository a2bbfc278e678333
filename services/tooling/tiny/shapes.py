"""The tiny model's size presets, apart from the model code so that configs check a preset without torch."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TinyShape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int


# Parameter counts with the 259-token vocabulary and tied embeddings (see tests/tooling/tiny/test_tiny_model.py).
SIZES: dict[str, TinyShape] = {
    "1m": TinyShape(hidden=128, layers=4, heads=4, kv_heads=2, intermediate=512),
    "2m": TinyShape(hidden=160, layers=6, heads=4, kv_heads=2, intermediate=640),
    "5m": TinyShape(hidden=256, layers=6, heads=8, kv_heads=4, intermediate=832),
    "20m": TinyShape(hidden=448, layers=8, heads=8, kv_heads=4, intermediate=1536),
}
