from services._proto.strand.v1 import gateway_pb2 as _gateway_pb2
from services._proto.strand.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetLoadsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetLoadsResponse(_message.Message):
    __slots__ = ("loads",)
    LOADS_FIELD_NUMBER: _ClassVar[int]
    loads: _containers.RepeatedCompositeFieldContainer[_types_pb2.EngineLoad]
    def __init__(self, loads: _Optional[_Iterable[_Union[_types_pb2.EngineLoad, _Mapping]]] = ...) -> None: ...

class SubscribeKvEventsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...
