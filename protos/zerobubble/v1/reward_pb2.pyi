from google.protobuf import struct_pb2 as _struct_pb2
from zerobubble.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ScoreOptions(_message.Message):
    __slots__ = ("partial_credit",)
    PARTIAL_CREDIT_FIELD_NUMBER: _ClassVar[int]
    partial_credit: bool
    def __init__(self, partial_credit: bool = ...) -> None: ...

class ScoreRequest(_message.Message):
    __slots__ = ("id", "verifier", "response", "gt_answer", "test_cases", "options", "prompt", "metadata")
    ID_FIELD_NUMBER: _ClassVar[int]
    VERIFIER_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    GT_ANSWER_FIELD_NUMBER: _ClassVar[int]
    TEST_CASES_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    id: str
    verifier: str
    response: str
    gt_answer: str
    test_cases: _common_pb2.TestCases
    options: ScoreOptions
    prompt: str
    metadata: _struct_pb2.Struct
    def __init__(self, id: _Optional[str] = ..., verifier: _Optional[str] = ..., response: _Optional[str] = ..., gt_answer: _Optional[str] = ..., test_cases: _Optional[_Union[_common_pb2.TestCases, _Mapping]] = ..., options: _Optional[_Union[ScoreOptions, _Mapping]] = ..., prompt: _Optional[str] = ..., metadata: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class ScoreResult(_message.Message):
    __slots__ = ("id", "reward", "format_ok", "answer_ok", "extracted_answer", "reason", "tests_passed", "tests_total", "seconds")
    ID_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    FORMAT_OK_FIELD_NUMBER: _ClassVar[int]
    ANSWER_OK_FIELD_NUMBER: _ClassVar[int]
    EXTRACTED_ANSWER_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    TESTS_PASSED_FIELD_NUMBER: _ClassVar[int]
    TESTS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    id: str
    reward: float
    format_ok: bool
    answer_ok: bool
    extracted_answer: str
    reason: str
    tests_passed: int
    tests_total: int
    seconds: float
    def __init__(self, id: _Optional[str] = ..., reward: _Optional[float] = ..., format_ok: bool = ..., answer_ok: bool = ..., extracted_answer: _Optional[str] = ..., reason: _Optional[str] = ..., tests_passed: _Optional[int] = ..., tests_total: _Optional[int] = ..., seconds: _Optional[float] = ...) -> None: ...

class ScoreBatchRequest(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[ScoreRequest]
    def __init__(self, items: _Optional[_Iterable[_Union[ScoreRequest, _Mapping]]] = ...) -> None: ...

class ScoreBatchReply(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[ScoreResult]
    def __init__(self, results: _Optional[_Iterable[_Union[ScoreResult, _Mapping]]] = ...) -> None: ...

class ListVerifiersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class VerifierInfo(_message.Message):
    __slots__ = ("name", "description", "ground_truth", "available", "unavailable_reason")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    GROUND_TRUTH_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    UNAVAILABLE_REASON_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    ground_truth: str
    available: bool
    unavailable_reason: str
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., ground_truth: _Optional[str] = ..., available: bool = ..., unavailable_reason: _Optional[str] = ...) -> None: ...

class ListVerifiersReply(_message.Message):
    __slots__ = ("verifiers", "correct_reward", "wrong_reward")
    VERIFIERS_FIELD_NUMBER: _ClassVar[int]
    CORRECT_REWARD_FIELD_NUMBER: _ClassVar[int]
    WRONG_REWARD_FIELD_NUMBER: _ClassVar[int]
    verifiers: _containers.RepeatedCompositeFieldContainer[VerifierInfo]
    correct_reward: float
    wrong_reward: float
    def __init__(self, verifiers: _Optional[_Iterable[_Union[VerifierInfo, _Mapping]]] = ..., correct_reward: _Optional[float] = ..., wrong_reward: _Optional[float] = ...) -> None: ...
