from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ListEnvironmentsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class EnvironmentInfo(_message.Message):
    __slots__ = ("name", "description", "tools_json", "tool_format")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    TOOLS_JSON_FIELD_NUMBER: _ClassVar[int]
    TOOL_FORMAT_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    tools_json: str
    tool_format: str
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., tools_json: _Optional[str] = ..., tool_format: _Optional[str] = ...) -> None: ...

class ListEnvironmentsReply(_message.Message):
    __slots__ = ("environments",)
    ENVIRONMENTS_FIELD_NUMBER: _ClassVar[int]
    environments: _containers.RepeatedCompositeFieldContainer[EnvironmentInfo]
    def __init__(self, environments: _Optional[_Iterable[_Union[EnvironmentInfo, _Mapping]]] = ...) -> None: ...

class OpenEpisodeRequest(_message.Message):
    __slots__ = ("environment", "row_json")
    ENVIRONMENT_FIELD_NUMBER: _ClassVar[int]
    ROW_JSON_FIELD_NUMBER: _ClassVar[int]
    environment: str
    row_json: str
    def __init__(self, environment: _Optional[str] = ..., row_json: _Optional[str] = ...) -> None: ...

class OpenEpisodeReply(_message.Message):
    __slots__ = ("episode_id", "opening_json", "tools_json")
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    OPENING_JSON_FIELD_NUMBER: _ClassVar[int]
    TOOLS_JSON_FIELD_NUMBER: _ClassVar[int]
    episode_id: str
    opening_json: str
    tools_json: str
    def __init__(self, episode_id: _Optional[str] = ..., opening_json: _Optional[str] = ..., tools_json: _Optional[str] = ...) -> None: ...

class StepEpisodeRequest(_message.Message):
    __slots__ = ("episode_id", "assistant_text")
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    ASSISTANT_TEXT_FIELD_NUMBER: _ClassVar[int]
    episode_id: str
    assistant_text: str
    def __init__(self, episode_id: _Optional[str] = ..., assistant_text: _Optional[str] = ...) -> None: ...

class StepEpisodeReply(_message.Message):
    __slots__ = ("observation_json", "reward", "done", "info_json", "tool_calls", "ended_reason")
    OBSERVATION_JSON_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    INFO_JSON_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    ENDED_REASON_FIELD_NUMBER: _ClassVar[int]
    observation_json: str
    reward: float
    done: bool
    info_json: str
    tool_calls: int
    ended_reason: str
    def __init__(self, observation_json: _Optional[str] = ..., reward: _Optional[float] = ..., done: bool = ..., info_json: _Optional[str] = ..., tool_calls: _Optional[int] = ..., ended_reason: _Optional[str] = ...) -> None: ...

class CloseEpisodeRequest(_message.Message):
    __slots__ = ("episode_id",)
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    episode_id: str
    def __init__(self, episode_id: _Optional[str] = ...) -> None: ...

class CloseEpisodeReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
