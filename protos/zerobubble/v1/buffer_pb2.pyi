from zerobubble.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class NotStored(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    NOT_STORED_UNSPECIFIED: _ClassVar[NotStored]
    NOT_STORED_DUPLICATE: _ClassVar[NotStored]
    NOT_STORED_PROMPT_DONE: _ClassVar[NotStored]
    NOT_STORED_ACCURACY: _ClassVar[NotStored]
NOT_STORED_UNSPECIFIED: NotStored
NOT_STORED_DUPLICATE: NotStored
NOT_STORED_PROMPT_DONE: NotStored
NOT_STORED_ACCURACY: NotStored

class LeaseRequest(_message.Message):
    __slots__ = ("worker_id", "count")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    count: int
    def __init__(self, worker_id: _Optional[str] = ..., count: _Optional[int] = ...) -> None: ...

class LeaseReply(_message.Message):
    __slots__ = ("lease_id", "prompts", "expires_in_seconds", "end_of_data", "policy_version", "epoch_size", "epoch_finished", "training_finished")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPTS_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_IN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    END_OF_DATA_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    EPOCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FINISHED_FIELD_NUMBER: _ClassVar[int]
    TRAINING_FINISHED_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    prompts: _containers.RepeatedCompositeFieldContainer[_common_pb2.Prompt]
    expires_in_seconds: float
    end_of_data: bool
    policy_version: int
    epoch_size: int
    epoch_finished: int
    training_finished: bool
    def __init__(self, lease_id: _Optional[str] = ..., prompts: _Optional[_Iterable[_Union[_common_pb2.Prompt, _Mapping]]] = ..., expires_in_seconds: _Optional[float] = ..., end_of_data: bool = ..., policy_version: _Optional[int] = ..., epoch_size: _Optional[int] = ..., epoch_finished: _Optional[int] = ..., training_finished: bool = ...) -> None: ...

class CompleteLeaseRequest(_message.Message):
    __slots__ = ("lease_id", "prompt_ids")
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_IDS_FIELD_NUMBER: _ClassVar[int]
    lease_id: str
    prompt_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, lease_id: _Optional[str] = ..., prompt_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class CompleteLeaseReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PushAck(_message.Message):
    __slots__ = ("producer_id", "sequence", "stored", "filtered", "code", "error", "not_stored")
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    STORED_FIELD_NUMBER: _ClassVar[int]
    FILTERED_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    NOT_STORED_FIELD_NUMBER: _ClassVar[int]
    producer_id: str
    sequence: int
    stored: bool
    filtered: str
    code: int
    error: str
    not_stored: NotStored
    def __init__(self, producer_id: _Optional[str] = ..., sequence: _Optional[int] = ..., stored: bool = ..., filtered: _Optional[str] = ..., code: _Optional[int] = ..., error: _Optional[str] = ..., not_stored: _Optional[_Union[NotStored, str]] = ...) -> None: ...

class PullRequest(_message.Message):
    __slots__ = ("rank", "world_size", "max_groups", "wait_seconds")
    RANK_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_GROUPS_FIELD_NUMBER: _ClassVar[int]
    WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    rank: int
    world_size: int
    max_groups: int
    wait_seconds: float
    def __init__(self, rank: _Optional[int] = ..., world_size: _Optional[int] = ..., max_groups: _Optional[int] = ..., wait_seconds: _Optional[float] = ...) -> None: ...

class PulledGroup(_message.Message):
    __slots__ = ("group", "delivery", "end_of_data")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_FIELD_NUMBER: _ClassVar[int]
    END_OF_DATA_FIELD_NUMBER: _ClassVar[int]
    group: _common_pb2.ExperienceGroup
    delivery: int
    end_of_data: bool
    def __init__(self, group: _Optional[_Union[_common_pb2.ExperienceGroup, _Mapping]] = ..., delivery: _Optional[int] = ..., end_of_data: bool = ...) -> None: ...

class AcknowledgeRequest(_message.Message):
    __slots__ = ("deliveries", "rank")
    DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    deliveries: _containers.RepeatedScalarFieldContainer[int]
    rank: int
    def __init__(self, deliveries: _Optional[_Iterable[int]] = ..., rank: _Optional[int] = ...) -> None: ...

class AcknowledgeReply(_message.Message):
    __slots__ = ("refused",)
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    refused: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, refused: _Optional[_Iterable[int]] = ...) -> None: ...

class CommitRequest(_message.Message):
    __slots__ = ("delivery", "resume")
    DELIVERY_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    delivery: int
    resume: bool
    def __init__(self, delivery: _Optional[int] = ..., resume: bool = ...) -> None: ...

class CommitReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SetPolicyVersionRequest(_message.Message):
    __slots__ = ("version", "training_finished")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TRAINING_FINISHED_FIELD_NUMBER: _ClassVar[int]
    version: int
    training_finished: bool
    def __init__(self, version: _Optional[int] = ..., training_finished: bool = ...) -> None: ...

class SetPolicyVersionReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StatsReply(_message.Message):
    __slots__ = ("queued_groups", "queued_bytes", "groups_in", "groups_out", "filtered", "stale_dropped", "lease_expirations", "epoch", "policy_version", "end_of_data", "unacknowledged", "returned")
    QUEUED_GROUPS_FIELD_NUMBER: _ClassVar[int]
    QUEUED_BYTES_FIELD_NUMBER: _ClassVar[int]
    GROUPS_IN_FIELD_NUMBER: _ClassVar[int]
    GROUPS_OUT_FIELD_NUMBER: _ClassVar[int]
    FILTERED_FIELD_NUMBER: _ClassVar[int]
    STALE_DROPPED_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRATIONS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    END_OF_DATA_FIELD_NUMBER: _ClassVar[int]
    UNACKNOWLEDGED_FIELD_NUMBER: _ClassVar[int]
    RETURNED_FIELD_NUMBER: _ClassVar[int]
    queued_groups: int
    queued_bytes: int
    groups_in: int
    groups_out: int
    filtered: int
    stale_dropped: int
    lease_expirations: int
    epoch: int
    policy_version: int
    end_of_data: bool
    unacknowledged: int
    returned: int
    def __init__(self, queued_groups: _Optional[int] = ..., queued_bytes: _Optional[int] = ..., groups_in: _Optional[int] = ..., groups_out: _Optional[int] = ..., filtered: _Optional[int] = ..., stale_dropped: _Optional[int] = ..., lease_expirations: _Optional[int] = ..., epoch: _Optional[int] = ..., policy_version: _Optional[int] = ..., end_of_data: bool = ..., unacknowledged: _Optional[int] = ..., returned: _Optional[int] = ...) -> None: ...

class GetRunSpecRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetRunSpecReply(_message.Message):
    __slots__ = ("spec_json",)
    SPEC_JSON_FIELD_NUMBER: _ClassVar[int]
    spec_json: str
    def __init__(self, spec_json: _Optional[str] = ...) -> None: ...
