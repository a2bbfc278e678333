"""Sharing GPU buffers between processes on the same GPU through CUDA IPC.

One GPU cannot hold a two-rank NCCL group, so a trainer and a rollout worker that share a GPU move
weights through CUDA IPC instead: the trainer exports its send buckets once as IPC handles (a few hundred
bytes, sent over any channel), the worker opens them, and each sync is then one device-to-device copy
on each side with no host round trip. The exporting process must keep the buffers alive while any peer
has them open.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence

import torch
from torch.multiprocessing.reductions import reduce_tensor


def export_handles(buffers: Sequence[torch.Tensor]) -> bytes:
    """The IPC handles of CUDA `buffers`, as bytes another process on the same GPU can open."""
    for index, buffer in enumerate(buffers):
        if not buffer.is_cuda:
            raise ValueError(f"buffers[{index}]: CUDA IPC shares CUDA tensors only, got one on {buffer.device}")
    return pickle.dumps([reduce_tensor(buffer) for buffer in buffers])


def open_handles(blob: bytes) -> list[torch.Tensor]:
    """Tensors over the exporter's buffers (no copy): reads see the exporter's latest writes once it has
    synchronised them."""
    return [rebuild(*args) for rebuild, args in pickle.loads(blob)]
