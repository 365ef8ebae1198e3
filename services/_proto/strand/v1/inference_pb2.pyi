from services._proto.strand.v1 import gateway_pb2 as _gateway_pb2
from services._proto.strand.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GenerateStreamRequest(_message.Message):
    __slots__ = ("generate", "cancel", "trace_context")
    class TraceContextEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    GENERATE_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    TRACE_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    generate: _gateway_pb2.GenerateRequest
    cancel: str
    trace_context: _containers.ScalarMap[str, str]
    def __init__(self, generate: _Optional[_Union[_gateway_pb2.GenerateRequest, _Mapping]] = ..., cancel: _Optional[str] = ..., trace_context: _Optional[_Mapping[str, str]] = ...) -> None: ...

class GenerateStreamResponse(_message.Message):
    __slots__ = ("output", "refused")
    OUTPUT_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    output: _types_pb2.RequestOutput
    refused: GenerateRefused
    def __init__(self, output: _Optional[_Union[_types_pb2.RequestOutput, _Mapping]] = ..., refused: _Optional[_Union[GenerateRefused, _Mapping]] = ...) -> None: ...

class GenerateRefused(_message.Message):
    __slots__ = ("request_id", "error")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    error: _types_pb2.StageError
    def __init__(self, request_id: _Optional[str] = ..., error: _Optional[_Union[_types_pb2.StageError, _Mapping]] = ...) -> None: ...
