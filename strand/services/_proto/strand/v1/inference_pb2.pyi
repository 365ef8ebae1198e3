from strand.services._proto.strand.v1 import gateway_pb2 as _gateway_pb2
from strand.services._proto.strand.v1 import types_pb2 as _types_pb2
from google.protobuf import descriptor as _descriptor
from typing import ClassVar as _ClassVar

DESCRIPTOR: _descriptor.FileDescriptor
