"""What both ends of the weight sync share: the bucket manifest, packing named tensors into flat byte
buckets and viewing them back, the store keys of the membership protocol, and forming one process
group per group epoch straight from the trainer's TCPStore (never the global default group).

The protocol (trainer = rank 0, see zerobubble.trainer.broadcaster for its side):
- a worker joins over gRPC (authenticated like every call, at most `max_members` of them) and is a member
  from the next publish on; closing its watch stream leaves;
- an announcement with a new group epoch names every member's rank; each member writes
  `arrived_key`, waits for `go_key` ("go" or "abort"), and only then builds the group, so a member
  that never arrives costs the others one arrival window (`formation_timeout_s`) and no gloo timeout;
  it is dropped, and the version goes to the others in a new epoch right after;
- after receiving every bucket of a version a member writes `done_key` ("ok", or "failed" when its
  receive broke); unless every member said "ok" within `member_timeout_s`, the trainer re-forms the
  group (whoever does not arrive is dropped: dead or stalled) and sends that version again;
- when the trainer gives a group epoch up (a broadcast failed, or it re-forms), it writes `broken_key`;
  members waiting on that epoch's buckets see it and leave at once, instead of after their timeout.
"""

from __future__ import annotations

import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed import PrefixStore, ProcessGroupGloo, Store

from zerobubble.v1 import trainer_pb2

MIB = 1024 * 1024
# Every slot starts on a multiple of this, so a view of the byte bucket as any dtype is legal (and aligned).
ALIGN = 64
ABANDON_POLL_S = 0.02
RETIRE_WAIT_S = 600.0
GO = b"go"
ACK_OK = b"ok"
ACK_FAILED = b"failed"
ABORT = b"abort"


def _align(offset: int) -> int:
    return (offset + ALIGN - 1) // ALIGN * ALIGN


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r}")
    return dtype


@dataclass(frozen=True)
class Slot:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    offset: int
    nbytes: int


@dataclass(frozen=True)
class BucketPlan:
    nbytes: int
    slots: tuple[Slot, ...]


@dataclass(frozen=True)
class Manifest:
    """Where each named tensor lives: which bucket, at which byte offset. Equal manifests share buffers."""

    buckets: tuple[BucketPlan, ...]

    @classmethod
    def plan(cls, named: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int) -> Manifest:
        """Pack tensors in order into buckets of about `bucket_bytes`; one larger tensor gets a bucket of its own."""
        buckets: list[BucketPlan] = []
        slots: list[Slot] = []
        end = 0
        for name, tensor in named:
            nbytes = tensor.numel() * tensor.element_size()
            offset = _align(end)
            if slots and offset + nbytes > bucket_bytes:
                buckets.append(BucketPlan(end, tuple(slots)))
                slots, offset = [], 0
            slots.append(Slot(name, tuple(tensor.shape), tensor.dtype, offset, nbytes))
            end = offset + nbytes
        if slots:
            buckets.append(BucketPlan(end, tuple(slots)))
        return cls(tuple(buckets))

    @property
    def total_bytes(self) -> int:
        return sum(b.nbytes for b in self.buckets)

    @property
    def names(self) -> list[str]:
        return [s.name for b in self.buckets for s in b.slots]

    def to_proto(self) -> list[trainer_pb2.Bucket]:
        return [
            trainer_pb2.Bucket(nbytes=b.nbytes, tensors=[
                trainer_pb2.TensorSlot(name=s.name, shape=s.shape, dtype=dtype_name(s.dtype), offset=s.offset,
                                       nbytes=s.nbytes)
                for s in b.slots
            ])
            for b in self.buckets
        ]

    @classmethod
    def from_proto(cls, buckets: Sequence[trainer_pb2.Bucket]) -> Manifest:
        plans = []
        for b in buckets:
            slots = tuple(Slot(s.name, tuple(s.shape), dtype_from_name(s.dtype), s.offset, s.nbytes) for s in b.tensors)
            for s in slots:
                if s.offset % ALIGN or s.offset + s.nbytes > b.nbytes:
                    raise ValueError(f"tensor {s.name!r}: slot [{s.offset}, +{s.nbytes}) does not fit its bucket")
            plans.append(BucketPlan(b.nbytes, slots))
        return cls(tuple(plans))

    def allocate(self, device: str | torch.device = "cpu") -> list[torch.Tensor]:
        return [torch.empty(b.nbytes, dtype=torch.uint8, device=device) for b in self.buckets]

    def views(self, buffers: Sequence[torch.Tensor]) -> list[tuple[str, torch.Tensor]]:
        """(name, tensor) views into the buffers: no copy, so they change when the buffers do."""
        out = []
        for plan, buffer in zip(self.buckets, buffers, strict=True):
            for s in plan.slots:
                out.append((s.name, buffer[s.offset:s.offset + s.nbytes].view(s.dtype).view(s.shape)))
        return out

    def pack(self, named: Iterable[tuple[str, torch.Tensor]], buffers: Sequence[torch.Tensor]) -> None:
        """Copy the tensors into the buffers; names, shapes and dtypes must match the plan."""
        targets = dict(self.views(buffers))
        seen = 0
        with torch.no_grad():
            for name, tensor in named:
                target = targets.get(name)
                if target is None or target.shape != tensor.shape or target.dtype != tensor.dtype:
                    raise ValueError(f"tensor {name!r} {tuple(tensor.shape)} {tensor.dtype} is not in the manifest")
                target.copy_(tensor.detach())
                seen += 1
        if seen != len(targets):
            raise ValueError(f"{len(targets) - seen} tensors of the manifest were not given")


def arrived_key(epoch: int, worker_id: str) -> str:
    return f"sync/{epoch}/arrived/{worker_id}"


def go_key(epoch: int) -> str:
    return f"sync/{epoch}/go"


def broken_key(epoch: int) -> str:
    return f"sync/{epoch}/broken"


def done_key(epoch: int, version: int, worker_id: str) -> str:
    return f"sync/{epoch}/done/{version}/{worker_id}"


def backend_for(device: str) -> str:
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def local_address_towards(host: str) -> str:
    """The address of this host's interface that routes to `host` (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((host, 9))
        return probe.getsockname()[0]


def form_group(store: Store, epoch: int, rank: int, world_size: int, *, backend: str, timeout_s: float,
               address: str) -> dist.ProcessGroup:
    """One process group for one group epoch, on its own key prefix of the trainer's store.

    `address` is the interface gloo listens on (one the other members can reach); `timeout_s` bounds
    every collective, so a peer that dies or stalls turns into an error instead of a hang."""
    prefixed = PrefixStore(f"epoch/{epoch}", store)
    timeout = timedelta(seconds=timeout_s)
    if backend == "gloo":
        options = ProcessGroupGloo._Options()
        options._devices = [ProcessGroupGloo.create_device(hostname=address)]
        options._timeout = timeout
        return ProcessGroupGloo(prefixed, rank, world_size, options)
    if backend == "nccl":
        from torch.distributed import ProcessGroupNCCL

        options = ProcessGroupNCCL.Options()
        options._timeout = timeout
        return ProcessGroupNCCL(prefixed, rank, world_size, options)
    raise ValueError(f"unknown backend {backend!r}: expected gloo or nccl")


def start_broadcast(group: dist.ProcessGroup, buffers: Sequence[torch.Tensor]) -> list[dist.Work]:
    """Rank 0 sends every bucket, the others receive in place; all buckets are in flight at once."""
    options = dist.BroadcastOptions()
    options.rootRank = 0
    return [group.broadcast([buffer], options) for buffer in buffers]


def wait_broadcast(works: Sequence[dist.Work], *, abandoned: Callable[[], bool] | None = None,
                   cuda_device: torch.device | None = None) -> None:
    """Wait for the buckets; raise if one failed or, polled meanwhile, `abandoned()` says the trainer gave
    this group epoch up (its peers then need not wait for their own timeouts to notice).

    Takes the works, not the group, so no exception traceback keeps a group alive (see retire_group)."""
    if abandoned is not None:
        # Woken by the works' own completion, not by polling them: a thread waking every millisecond takes
        # cores from the transfer it waits for.
        done = _all_done(works)
        while not done.wait(ABANDON_POLL_S):
            if abandoned():
                raise GroupAbandoned("the trainer gave this group epoch up")
    for work in works:
        work.wait()
    if cuda_device is not None:
        torch.cuda.current_stream(cuda_device).synchronize()


def _all_done(works: Sequence[dist.Work]) -> threading.Event:
    """An event set once every work has completed, failed ones included."""
    done = threading.Event()
    torch.futures.collect_all([work.get_future() for work in works]).add_done_callback(lambda _: done.set())
    return done


class GroupAbandoned(RuntimeError):
    pass


def retire_group(group: dist.ProcessGroup | None) -> None:
    """Let go of a group without waiting: a gloo group's destructor waits for its pending operations (up to
    the timeout), so the last reference is dropped in a thread of its own, once the caller has let go."""
    if group is None:
        return
    holder = [group]
    del group

    def release() -> None:
        deadline = time.monotonic() + RETIRE_WAIT_S
        # References: the holder's and getrefcount's own argument; more means someone still uses it.
        while sys.getrefcount(holder[0]) > 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        holder.clear()

    threading.Thread(target=release, name="retire-group", daemon=True).start()
