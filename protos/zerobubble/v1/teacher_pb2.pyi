from zerobubble.v1 import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ConnectRequest(_message.Message):
    __slots__ = ("tokenizer_fingerprint", "tokenizer_name")
    TOKENIZER_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_NAME_FIELD_NUMBER: _ClassVar[int]
    tokenizer_fingerprint: str
    tokenizer_name: str
    def __init__(self, tokenizer_fingerprint: _Optional[str] = ..., tokenizer_name: _Optional[str] = ...) -> None: ...

class ConnectReply(_message.Message):
    __slots__ = ("model", "tokenizer_fingerprint", "tokenizer_name", "vocab_size", "max_sequences", "max_tokens_per_request", "max_sequence_tokens")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_NAME_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_PER_REQUEST_FIELD_NUMBER: _ClassVar[int]
    MAX_SEQUENCE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    model: str
    tokenizer_fingerprint: str
    tokenizer_name: str
    vocab_size: int
    max_sequences: int
    max_tokens_per_request: int
    max_sequence_tokens: int
    def __init__(self, model: _Optional[str] = ..., tokenizer_fingerprint: _Optional[str] = ..., tokenizer_name: _Optional[str] = ..., vocab_size: _Optional[int] = ..., max_sequences: _Optional[int] = ..., max_tokens_per_request: _Optional[int] = ..., max_sequence_tokens: _Optional[int] = ...) -> None: ...

class TokenSequence(_message.Message):
    __slots__ = ("token_ids", "score_from")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SCORE_FROM_FIELD_NUMBER: _ClassVar[int]
    token_ids: _common_pb2.Array
    score_from: int
    def __init__(self, token_ids: _Optional[_Union[_common_pb2.Array, _Mapping]] = ..., score_from: _Optional[int] = ...) -> None: ...

class LogprobsRequest(_message.Message):
    __slots__ = ("sequences", "tokenizer_fingerprint")
    SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    sequences: _containers.RepeatedCompositeFieldContainer[TokenSequence]
    tokenizer_fingerprint: str
    def __init__(self, sequences: _Optional[_Iterable[_Union[TokenSequence, _Mapping]]] = ..., tokenizer_fingerprint: _Optional[str] = ...) -> None: ...

class TokenLogprobs(_message.Message):
    __slots__ = ("logprobs",)
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    logprobs: _common_pb2.Array
    def __init__(self, logprobs: _Optional[_Union[_common_pb2.Array, _Mapping]] = ...) -> None: ...

class LogprobsReply(_message.Message):
    __slots__ = ("sequences",)
    SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    sequences: _containers.RepeatedCompositeFieldContainer[TokenLogprobs]
    def __init__(self, sequences: _Optional[_Iterable[_Union[TokenLogprobs, _Mapping]]] = ...) -> None: ...
