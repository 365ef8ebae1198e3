from services._proto.strand.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DetokAddRequest(_message.Message):
    __slots__ = ("processed",)
    PROCESSED_FIELD_NUMBER: _ClassVar[int]
    processed: _types_pb2.ProcessedPrompt
    def __init__(self, processed: _Optional[_Union[_types_pb2.ProcessedPrompt, _Mapping]] = ...) -> None: ...

class DetokProcessOutputs(_message.Message):
    __slots__ = ("outputs",)
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    outputs: _types_pb2.EngineCoreOutputs
    def __init__(self, outputs: _Optional[_Union[_types_pb2.EngineCoreOutputs, _Mapping]] = ...) -> None: ...

class DetokAbort(_message.Message):
    __slots__ = ("request_ids",)
    REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    request_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, request_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class DetokFinishWithError(_message.Message):
    __slots__ = ("request_ids", "reason")
    REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    request_ids: _containers.RepeatedScalarFieldContainer[str]
    reason: str
    def __init__(self, request_ids: _Optional[_Iterable[str]] = ..., reason: _Optional[str] = ...) -> None: ...

class DetokQuery(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DetokenizerRequest(_message.Message):
    __slots__ = ("seq", "trace_context", "add", "process_outputs", "abort", "finish_with_error", "query")
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
    PROCESS_OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    ABORT_FIELD_NUMBER: _ClassVar[int]
    FINISH_WITH_ERROR_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    seq: int
    trace_context: _containers.ScalarMap[str, str]
    add: DetokAddRequest
    process_outputs: DetokProcessOutputs
    abort: DetokAbort
    finish_with_error: DetokFinishWithError
    query: DetokQuery
    def __init__(self, seq: _Optional[int] = ..., trace_context: _Optional[_Mapping[str, str]] = ..., add: _Optional[_Union[DetokAddRequest, _Mapping]] = ..., process_outputs: _Optional[_Union[DetokProcessOutputs, _Mapping]] = ..., abort: _Optional[_Union[DetokAbort, _Mapping]] = ..., finish_with_error: _Optional[_Union[DetokFinishWithError, _Mapping]] = ..., query: _Optional[_Union[DetokQuery, _Mapping]] = ...) -> None: ...

class ChildRequests(_message.Message):
    __slots__ = ("requests",)
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[_types_pb2.EngineCoreRequest]
    def __init__(self, requests: _Optional[_Iterable[_Union[_types_pb2.EngineCoreRequest, _Mapping]]] = ...) -> None: ...

class RequestIds(_message.Message):
    __slots__ = ("request_ids",)
    REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    request_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, request_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ProcessOutputsResult(_message.Message):
    __slots__ = ("request_outputs", "reqs_to_abort")
    REQUEST_OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    REQS_TO_ABORT_FIELD_NUMBER: _ClassVar[int]
    request_outputs: _containers.RepeatedCompositeFieldContainer[_types_pb2.RequestOutput]
    reqs_to_abort: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, request_outputs: _Optional[_Iterable[_Union[_types_pb2.RequestOutput, _Mapping]]] = ..., reqs_to_abort: _Optional[_Iterable[str]] = ...) -> None: ...

class DetokState(_message.Message):
    __slots__ = ("num_unfinished_requests",)
    NUM_UNFINISHED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    num_unfinished_requests: int
    def __init__(self, num_unfinished_requests: _Optional[int] = ...) -> None: ...

class DetokenizerResponse(_message.Message):
    __slots__ = ("seq", "children", "result", "child_ids", "state", "error")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    CHILDREN_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    CHILD_IDS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    seq: int
    children: ChildRequests
    result: ProcessOutputsResult
    child_ids: RequestIds
    state: DetokState
    error: _types_pb2.StageError
    def __init__(self, seq: _Optional[int] = ..., children: _Optional[_Union[ChildRequests, _Mapping]] = ..., result: _Optional[_Union[ProcessOutputsResult, _Mapping]] = ..., child_ids: _Optional[_Union[RequestIds, _Mapping]] = ..., state: _Optional[_Union[DetokState, _Mapping]] = ..., error: _Optional[_Union[_types_pb2.StageError, _Mapping]] = ...) -> None: ...
