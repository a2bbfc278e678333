from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DTYPE_UNSPECIFIED: _ClassVar[DType]
    DTYPE_BOOL: _ClassVar[DType]
    DTYPE_UINT8: _ClassVar[DType]
    DTYPE_INT8: _ClassVar[DType]
    DTYPE_INT16: _ClassVar[DType]
    DTYPE_INT32: _ClassVar[DType]
    DTYPE_INT64: _ClassVar[DType]
    DTYPE_FLOAT16: _ClassVar[DType]
    DTYPE_BFLOAT16: _ClassVar[DType]
    DTYPE_FLOAT32: _ClassVar[DType]
    DTYPE_FLOAT64: _ClassVar[DType]

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
DTYPE_UNSPECIFIED: DType
DTYPE_BOOL: DType
DTYPE_UINT8: DType
DTYPE_INT8: DType
DTYPE_INT16: DType
DTYPE_INT32: DType
DTYPE_INT64: DType
DTYPE_FLOAT16: DType
DTYPE_BFLOAT16: DType
DTYPE_FLOAT32: DType
DTYPE_FLOAT64: DType
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_LENGTH: FinishReason

class Array(_message.Message):
    __slots__ = ("dtype", "shape", "data")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    dtype: DType
    shape: _containers.RepeatedScalarFieldContainer[int]
    data: bytes
    def __init__(self, dtype: _Optional[_Union[DType, str]] = ..., shape: _Optional[_Iterable[int]] = ..., data: _Optional[bytes] = ...) -> None: ...

class TestCases(_message.Message):
    __slots__ = ("inputs", "outputs")
    INPUTS_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    inputs: _containers.RepeatedScalarFieldContainer[str]
    outputs: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, inputs: _Optional[_Iterable[str]] = ..., outputs: _Optional[_Iterable[str]] = ...) -> None: ...

class Prompt(_message.Message):
    __slots__ = ("prompt_id", "epoch", "messages_json", "gt_answer", "test_cases", "data_source")
    PROMPT_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_JSON_FIELD_NUMBER: _ClassVar[int]
    GT_ANSWER_FIELD_NUMBER: _ClassVar[int]
    TEST_CASES_FIELD_NUMBER: _ClassVar[int]
    DATA_SOURCE_FIELD_NUMBER: _ClassVar[int]
    prompt_id: str
    epoch: int
    messages_json: str
    gt_answer: str
    test_cases: TestCases
    data_source: str
    def __init__(self, prompt_id: _Optional[str] = ..., epoch: _Optional[int] = ..., messages_json: _Optional[str] = ..., gt_answer: _Optional[str] = ..., test_cases: _Optional[_Union[TestCases, _Mapping]] = ..., data_source: _Optional[str] = ...) -> None: ...

class Trajectory(_message.Message):
    __slots__ = ("response_ids", "behaviour_logprobs", "finish_reason", "reward", "format_ok", "answer_ok", "policy_version", "temperature", "response_text", "loss_mask", "version_spans", "episode", "sampling_support")
    RESPONSE_IDS_FIELD_NUMBER: _ClassVar[int]
    BEHAVIOUR_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    FORMAT_OK_FIELD_NUMBER: _ClassVar[int]
    ANSWER_OK_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_TEXT_FIELD_NUMBER: _ClassVar[int]
    LOSS_MASK_FIELD_NUMBER: _ClassVar[int]
    VERSION_SPANS_FIELD_NUMBER: _ClassVar[int]
    EPISODE_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_SUPPORT_FIELD_NUMBER: _ClassVar[int]
    response_ids: Array
    behaviour_logprobs: Array
    finish_reason: FinishReason
    reward: float
    format_ok: bool
    answer_ok: bool
    policy_version: int
    temperature: float
    response_text: str
    loss_mask: Array
    version_spans: _containers.RepeatedCompositeFieldContainer[VersionSpan]
    episode: EpisodeInfo
    sampling_support: Array
    def __init__(self, response_ids: _Optional[_Union[Array, _Mapping]] = ..., behaviour_logprobs: _Optional[_Union[Array, _Mapping]] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., reward: _Optional[float] = ..., format_ok: bool = ..., answer_ok: bool = ..., policy_version: _Optional[int] = ..., temperature: _Optional[float] = ..., response_text: _Optional[str] = ..., loss_mask: _Optional[_Union[Array, _Mapping]] = ..., version_spans: _Optional[_Iterable[_Union[VersionSpan, _Mapping]]] = ..., episode: _Optional[_Union[EpisodeInfo, _Mapping]] = ..., sampling_support: _Optional[_Union[Array, _Mapping]] = ...) -> None: ...

class VersionSpan(_message.Message):
    __slots__ = ("start", "version")
    START_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    start: int
    version: int
    def __init__(self, start: _Optional[int] = ..., version: _Optional[int] = ...) -> None: ...

class EpisodeInfo(_message.Message):
    __slots__ = ("environment", "turns", "tool_calls", "step_rewards", "ended_reason", "error")
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    TURNS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    STEP_REWARDS_FIELD_NUMBER: _ClassVar[int]
    ENDED_REASON_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    environment: str
    turns: int
    tool_calls: int
    step_rewards: _containers.RepeatedScalarFieldContainer[float]
    ended_reason: str
    error: str
    def __init__(self, environment: _Optional[str] = ..., turns: _Optional[int] = ..., tool_calls: _Optional[int] = ..., step_rewards: _Optional[_Iterable[float]] = ..., ended_reason: _Optional[str] = ..., error: _Optional[str] = ...) -> None: ...

class ExperienceGroup(_message.Message):
    __slots__ = ("prompt", "prompt_ids", "trajectories", "producer_id", "sequence", "lease_id", "producer_incarnation")
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_IDS_FIELD_NUMBER: _ClassVar[int]
    TRAJECTORIES_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    LEASE_ID_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_INCARNATION_FIELD_NUMBER: _ClassVar[int]
    prompt: Prompt
    prompt_ids: Array
    trajectories: _containers.RepeatedCompositeFieldContainer[Trajectory]
    producer_id: str
    sequence: int
    lease_id: str
    producer_incarnation: str
    def __init__(self, prompt: _Optional[_Union[Prompt, _Mapping]] = ..., prompt_ids: _Optional[_Union[Array, _Mapping]] = ..., trajectories: _Optional[_Iterable[_Union[Trajectory, _Mapping]]] = ..., producer_id: _Optional[str] = ..., sequence: _Optional[int] = ..., lease_id: _Optional[str] = ..., producer_incarnation: _Optional[str] = ...) -> None: ...
