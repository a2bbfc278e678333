from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class JoinRequest(_message.Message):
    __slots__ = ("worker_id", "device")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    DEVICE_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    device: str
    def __init__(self, worker_id: _Optional[str] = ..., device: _Optional[str] = ...) -> None: ...

class JoinReply(_message.Message):
    __slots__ = ("rank", "world_size", "group_epoch", "store_host", "store_port", "backend", "member_timeout_seconds")
    RANK_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    GROUP_EPOCH_FIELD_NUMBER: _ClassVar[int]
    STORE_HOST_FIELD_NUMBER: _ClassVar[int]
    STORE_PORT_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    MEMBER_TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    rank: int
    world_size: int
    group_epoch: int
    store_host: str
    store_port: int
    backend: str
    member_timeout_seconds: float
    def __init__(self, rank: _Optional[int] = ..., world_size: _Optional[int] = ..., group_epoch: _Optional[int] = ..., store_host: _Optional[str] = ..., store_port: _Optional[int] = ..., backend: _Optional[str] = ..., member_timeout_seconds: _Optional[float] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("worker_id",)
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    def __init__(self, worker_id: _Optional[str] = ...) -> None: ...

class TensorSlot(_message.Message):
    __slots__ = ("name", "shape", "dtype", "offset", "nbytes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    name: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    dtype: str
    offset: int
    nbytes: int
    def __init__(self, name: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., dtype: _Optional[str] = ..., offset: _Optional[int] = ..., nbytes: _Optional[int] = ...) -> None: ...

class Bucket(_message.Message):
    __slots__ = ("nbytes", "tensors")
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    nbytes: int
    tensors: _containers.RepeatedCompositeFieldContainer[TensorSlot]
    def __init__(self, nbytes: _Optional[int] = ..., tensors: _Optional[_Iterable[_Union[TensorSlot, _Mapping]]] = ...) -> None: ...

class WeightAnnouncement(_message.Message):
    __slots__ = ("version", "group_epoch", "world_size", "buckets", "regroup", "ranks")
    class RanksEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    VERSION_FIELD_NUMBER: _ClassVar[int]
    GROUP_EPOCH_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    BUCKETS_FIELD_NUMBER: _ClassVar[int]
    REGROUP_FIELD_NUMBER: _ClassVar[int]
    RANKS_FIELD_NUMBER: _ClassVar[int]
    version: int
    group_epoch: int
    world_size: int
    buckets: _containers.RepeatedCompositeFieldContainer[Bucket]
    regroup: bool
    ranks: _containers.ScalarMap[str, int]
    def __init__(self, version: _Optional[int] = ..., group_epoch: _Optional[int] = ..., world_size: _Optional[int] = ..., buckets: _Optional[_Iterable[_Union[Bucket, _Mapping]]] = ..., regroup: bool = ..., ranks: _Optional[_Mapping[str, int]] = ...) -> None: ...

class TrainerStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class TrainerStatusReply(_message.Message):
    __slots__ = ("step", "policy_version", "sync_members", "last_sync_seconds", "last_checkpoint", "synced_version", "group_epoch", "state")
    STEP_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    SYNC_MEMBERS_FIELD_NUMBER: _ClassVar[int]
    LAST_SYNC_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LAST_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    SYNCED_VERSION_FIELD_NUMBER: _ClassVar[int]
    GROUP_EPOCH_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    step: int
    policy_version: int
    sync_members: int
    last_sync_seconds: float
    last_checkpoint: str
    synced_version: int
    group_epoch: int
    state: str
    def __init__(self, step: _Optional[int] = ..., policy_version: _Optional[int] = ..., sync_members: _Optional[int] = ..., last_sync_seconds: _Optional[float] = ..., last_checkpoint: _Optional[str] = ..., synced_version: _Optional[int] = ..., group_epoch: _Optional[int] = ..., state: _Optional[str] = ...) -> None: ...

class SaveCheckpointRequest(_message.Message):
    __slots__ = ("tag",)
    TAG_FIELD_NUMBER: _ClassVar[int]
    tag: str
    def __init__(self, tag: _Optional[str] = ...) -> None: ...

class SaveCheckpointReply(_message.Message):
    __slots__ = ("path", "step")
    PATH_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    path: str
    step: int
    def __init__(self, path: _Optional[str] = ..., step: _Optional[int] = ...) -> None: ...
