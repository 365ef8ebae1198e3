from strand.services._proto.strand.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DetokAddRequest(_message.Message):
    __slots__ = ("processed", "origin", "engine")
    PROCESSED_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    processed: _types_pb2.ProcessedPrompt
    origin: str
    engine: str
    def __init__(self, processed: _Optional[_Union[_types_pb2.ProcessedPrompt, _Mapping]] = ..., origin: _Optional[str] = ..., engine: _Optional[str] = ...) -> None: ...

class DetokAbort(_message.Message):
    __slots__ = ("request_ids", "never_admitted")
    REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    NEVER_ADMITTED_FIELD_NUMBER: _ClassVar[int]
    request_ids: _containers.RepeatedScalarFieldContainer[str]
    never_admitted: bool
    def __init__(self, request_ids: _Optional[_Iterable[str]] = ..., never_admitted: _Optional[bool] = ...) -> None: ...

class DetokQuery(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DetokenizerRequest(_message.Message):
    __slots__ = ("seq", "trace_context", "add", "abort", "query")
    class TraceContextEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TRACE_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    ADD_FIELD_NUMBER: _ClassVar[int]
    ABORT_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    seq: int
    trace_context: _containers.ScalarMap[str, str]
    add: DetokAddRequest
    abort: DetokAbort
    query: DetokQuery
    def __init__(self, seq: _Optional[int] = ..., trace_context: _Optional[_Mapping[str, str]] = ..., add: _Optional[_Union[DetokAddRequest, _Mapping]] = ..., abort: _Optional[_Union[DetokAbort, _Mapping]] = ..., query: _Optional[_Union[DetokQuery, _Mapping]] = ...) -> None: ...

class RequestIds(_message.Message):
    __slots__ = ("request_ids",)
    REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    request_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, request_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class DetokState(_message.Message):
    __slots__ = ("num_unfinished_requests", "engine_subscribed")
    NUM_UNFINISHED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    ENGINE_SUBSCRIBED_FIELD_NUMBER: _ClassVar[int]
    num_unfinished_requests: int
    engine_subscribed: bool
    def __init__(self, num_unfinished_requests: _Optional[int] = ..., engine_subscribed: _Optional[bool] = ...) -> None: ...

class DetokenizerResponse(_message.Message):
    __slots__ = ("seq", "child_ids", "state", "error")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    CHILD_IDS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    seq: int
    child_ids: RequestIds
    state: DetokState
    error: _types_pb2.StageError
    def __init__(self, seq: _Optional[int] = ..., child_ids: _Optional[_Union[RequestIds, _Mapping]] = ..., state: _Optional[_Union[DetokState, _Mapping]] = ..., error: _Optional[_Union[_types_pb2.StageError, _Mapping]] = ...) -> None: ...

class DetokOutputsRequest(_message.Message):
    __slots__ = ("origin",)
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    origin: str
    def __init__(self, origin: _Optional[str] = ...) -> None: ...

class OutputBatch(_message.Message):
    __slots__ = ("step_id", "outputs", "subscribed")
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBED_FIELD_NUMBER: _ClassVar[int]
    step_id: int
    outputs: _containers.RepeatedCompositeFieldContainer[_types_pb2.RequestOutput]
    subscribed: bool
    def __init__(self, step_id: _Optional[int] = ..., outputs: _Optional[_Iterable[_Union[_types_pb2.RequestOutput, _Mapping]]] = ..., subscribed: _Optional[bool] = ...) -> None: ...
