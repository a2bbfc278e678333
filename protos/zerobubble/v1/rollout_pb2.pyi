from zerobubble.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SamplingParams(_message.Message):
    __slots__ = ("n", "temperature", "top_p", "top_k", "max_new_tokens", "stop")
    N_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    n: int
    temperature: float
    top_p: float
    top_k: int
    max_new_tokens: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, n: _Optional[int] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., max_new_tokens: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("prompts", "sampling", "raw")
    PROMPTS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    RAW_FIELD_NUMBER: _ClassVar[int]
    prompts: _containers.RepeatedScalarFieldContainer[str]
    sampling: SamplingParams
    raw: bool
    def __init__(self, prompts: _Optional[_Iterable[str]] = ..., sampling: _Optional[_Union[SamplingParams, _Mapping]] = ..., raw: bool = ...) -> None: ...

class Completion(_message.Message):
    __slots__ = ("text", "token_ids", "logprobs", "finish_reason")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_ids: _common_pb2.Array
    logprobs: _common_pb2.Array
    finish_reason: _common_pb2.FinishReason
    def __init__(self, text: _Optional[str] = ..., token_ids: _Optional[_Union[_common_pb2.Array, _Mapping]] = ..., logprobs: _Optional[_Union[_common_pb2.Array, _Mapping]] = ..., finish_reason: _Optional[_Union[_common_pb2.FinishReason, str]] = ...) -> None: ...

class GenerateReply(_message.Message):
    __slots__ = ("completions", "policy_version")
    COMPLETIONS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    completions: _containers.RepeatedCompositeFieldContainer[Completion]
    policy_version: int
    def __init__(self, completions: _Optional[_Iterable[_Union[Completion, _Mapping]]] = ..., policy_version: _Optional[int] = ...) -> None: ...

class RolloutStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RolloutStatusReply(_message.Message):
    __slots__ = ("worker_id", "engine", "policy_version", "paused", "groups_pushed", "tokens_per_second")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    PAUSED_FIELD_NUMBER: _ClassVar[int]
    GROUPS_PUSHED_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    engine: str
    policy_version: int
    paused: bool
    groups_pushed: int
    tokens_per_second: float
    def __init__(self, worker_id: _Optional[str] = ..., engine: _Optional[str] = ..., policy_version: _Optional[int] = ..., paused: bool = ..., groups_pushed: _Optional[int] = ..., tokens_per_second: _Optional[float] = ...) -> None: ...

class PauseRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PauseReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ResumeRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ResumeReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
