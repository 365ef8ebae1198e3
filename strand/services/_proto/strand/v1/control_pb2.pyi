from strand.services._proto.strand.v1 import gateway_pb2 as _gateway_pb2
from strand.services._proto.strand.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SleepRequest(_message.Message):
    __slots__ = ("level",)
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    level: int
    def __init__(self, level: _Optional[int] = ...) -> None: ...

class SleepResponse(_message.Message):
    __slots__ = ("is_sleeping",)
    IS_SLEEPING_FIELD_NUMBER: _ClassVar[int]
    is_sleeping: bool
    def __init__(self, is_sleeping: _Optional[bool] = ...) -> None: ...

class WakeUpRequest(_message.Message):
    __slots__ = ("tags",)
    TAGS_FIELD_NUMBER: _ClassVar[int]
    tags: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, tags: _Optional[_Iterable[str]] = ...) -> None: ...

class WakeUpResponse(_message.Message):
    __slots__ = ("is_sleeping",)
    IS_SLEEPING_FIELD_NUMBER: _ClassVar[int]
    is_sleeping: bool
    def __init__(self, is_sleeping: _Optional[bool] = ...) -> None: ...

class IsSleepingRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class IsSleepingResponse(_message.Message):
    __slots__ = ("is_sleeping",)
    IS_SLEEPING_FIELD_NUMBER: _ClassVar[int]
    is_sleeping: bool
    def __init__(self, is_sleeping: _Optional[bool] = ...) -> None: ...

class StartProfileRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StartProfileResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StopProfileRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StopProfileResponse(_message.Message):
    __slots__ = ("trace_path",)
    TRACE_PATH_FIELD_NUMBER: _ClassVar[int]
    trace_path: str
    def __init__(self, trace_path: _Optional[str] = ...) -> None: ...

class GetSupportedTasksRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetSupportedTasksResponse(_message.Message):
    __slots__ = ("tasks",)
    TASKS_FIELD_NUMBER: _ClassVar[int]
    tasks: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, tasks: _Optional[_Iterable[str]] = ...) -> None: ...

class AddLoraRequest(_message.Message):
    __slots__ = ("lora_request",)
    LORA_REQUEST_FIELD_NUMBER: _ClassVar[int]
    lora_request: _types_pb2.LoRARequest
    def __init__(self, lora_request: _Optional[_Union[_types_pb2.LoRARequest, _Mapping]] = ...) -> None: ...

class RemoveLoraRequest(_message.Message):
    __slots__ = ("lora_id",)
    LORA_ID_FIELD_NUMBER: _ClassVar[int]
    lora_id: int
    def __init__(self, lora_id: _Optional[int] = ...) -> None: ...

class ListLorasRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PinLoraRequest(_message.Message):
    __slots__ = ("lora_id",)
    LORA_ID_FIELD_NUMBER: _ClassVar[int]
    lora_id: int
    def __init__(self, lora_id: _Optional[int] = ...) -> None: ...

class LoraResponse(_message.Message):
    __slots__ = ("success", "lora_ids")
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    LORA_IDS_FIELD_NUMBER: _ClassVar[int]
    success: bool
    lora_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, success: _Optional[bool] = ..., lora_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class GetLoadsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetLoadsResponse(_message.Message):
    __slots__ = ("loads",)
    LOADS_FIELD_NUMBER: _ClassVar[int]
    loads: _containers.RepeatedCompositeFieldContainer[_types_pb2.EngineLoad]
    def __init__(self, loads: _Optional[_Iterable[_Union[_types_pb2.EngineLoad, _Mapping]]] = ...) -> None: ...

class SubscribeKvEventsRequest(_message.Message):
    __slots__ = ("resume",)
    RESUME_FIELD_NUMBER: _ClassVar[int]
    resume: _containers.RepeatedCompositeFieldContainer[KvEventsResume]
    def __init__(self, resume: _Optional[_Iterable[_Union[KvEventsResume, _Mapping]]] = ...) -> None: ...

class KvEventsResume(_message.Message):
    __slots__ = ("engine", "start_sequence_number", "epoch")
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    START_SEQUENCE_NUMBER_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    engine: str
    start_sequence_number: int
    epoch: str
    def __init__(self, engine: _Optional[str] = ..., start_sequence_number: _Optional[int] = ..., epoch: _Optional[str] = ...) -> None: ...
