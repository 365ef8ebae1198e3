from strand.services._proto.strand.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ProcessRequest(_message.Message):
    __slots__ = ("request_id", "prompt", "params", "arrival_time", "priority", "origin", "lora_request", "pooling_params", "deadline")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    ARRIVAL_TIME_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    LORA_REQUEST_FIELD_NUMBER: _ClassVar[int]
    POOLING_PARAMS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prompt: _types_pb2.Prompt
    params: _types_pb2.SamplingParams
    arrival_time: float
    priority: int
    origin: str
    lora_request: _types_pb2.LoRARequest
    pooling_params: _types_pb2.PoolingParams
    deadline: float
    def __init__(self, request_id: _Optional[str] = ..., prompt: _Optional[_Union[_types_pb2.Prompt, _Mapping]] = ..., params: _Optional[_Union[_types_pb2.SamplingParams, _Mapping]] = ..., arrival_time: _Optional[float] = ..., priority: _Optional[int] = ..., origin: _Optional[str] = ..., lora_request: _Optional[_Union[_types_pb2.LoRARequest, _Mapping]] = ..., pooling_params: _Optional[_Union[_types_pb2.PoolingParams, _Mapping]] = ..., deadline: _Optional[float] = ...) -> None: ...

class TokenizerRequest(_message.Message):
    __slots__ = ("seq", "trace_context", "process", "tokenize", "detokenize", "abort")
    class TraceContextEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TRACE_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    PROCESS_FIELD_NUMBER: _ClassVar[int]
    TOKENIZE_FIELD_NUMBER: _ClassVar[int]
    DETOKENIZE_FIELD_NUMBER: _ClassVar[int]
    ABORT_FIELD_NUMBER: _ClassVar[int]
    seq: int
    trace_context: _containers.ScalarMap[str, str]
    process: ProcessRequest
    tokenize: _types_pb2.TokenizeRequest
    detokenize: _types_pb2.DetokenizeRequest
    abort: TokenizerAbort
    def __init__(self, seq: _Optional[int] = ..., trace_context: _Optional[_Mapping[str, str]] = ..., process: _Optional[_Union[ProcessRequest, _Mapping]] = ..., tokenize: _Optional[_Union[_types_pb2.TokenizeRequest, _Mapping]] = ..., detokenize: _Optional[_Union[_types_pb2.DetokenizeRequest, _Mapping]] = ..., abort: _Optional[_Union[TokenizerAbort, _Mapping]] = ...) -> None: ...

class TokenizerAbort(_message.Message):
    __slots__ = ("request_ids",)
    REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    request_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, request_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class AddedRequest(_message.Message):
    __slots__ = ("child_ids", "num_prompt_tokens", "output_kind")
    CHILD_IDS_FIELD_NUMBER: _ClassVar[int]
    NUM_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_KIND_FIELD_NUMBER: _ClassVar[int]
    child_ids: _containers.RepeatedScalarFieldContainer[str]
    num_prompt_tokens: int
    output_kind: int
    def __init__(self, child_ids: _Optional[_Iterable[str]] = ..., num_prompt_tokens: _Optional[int] = ..., output_kind: _Optional[int] = ...) -> None: ...

class TokenizerResponse(_message.Message):
    __slots__ = ("seq", "added", "error", "tokenized", "detokenized")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    ADDED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    TOKENIZED_FIELD_NUMBER: _ClassVar[int]
    DETOKENIZED_FIELD_NUMBER: _ClassVar[int]
    seq: int
    added: AddedRequest
    error: _types_pb2.StageError
    tokenized: _types_pb2.TokenizeResponse
    detokenized: _types_pb2.DetokenizeResponse
    def __init__(self, seq: _Optional[int] = ..., added: _Optional[_Union[AddedRequest, _Mapping]] = ..., error: _Optional[_Union[_types_pb2.StageError, _Mapping]] = ..., tokenized: _Optional[_Union[_types_pb2.TokenizeResponse, _Mapping]] = ..., detokenized: _Optional[_Union[_types_pb2.DetokenizeResponse, _Mapping]] = ...) -> None: ...
