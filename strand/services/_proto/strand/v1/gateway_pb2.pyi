from strand.services._proto.strand.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AddRequestRequest(_message.Message):
    __slots__ = ("request_id", "prompt", "params", "arrival_time", "priority", "lora_request", "pooling_params")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    ARRIVAL_TIME_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    LORA_REQUEST_FIELD_NUMBER: _ClassVar[int]
    POOLING_PARAMS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prompt: _types_pb2.Prompt
    params: _types_pb2.SamplingParams
    arrival_time: float
    priority: int
    lora_request: _types_pb2.LoRARequest
    pooling_params: _types_pb2.PoolingParams
    def __init__(self, request_id: _Optional[str] = ..., prompt: _Optional[_Union[_types_pb2.Prompt, _Mapping]] = ..., params: _Optional[_Union[_types_pb2.SamplingParams, _Mapping]] = ..., arrival_time: _Optional[float] = ..., priority: _Optional[int] = ..., lora_request: _Optional[_Union[_types_pb2.LoRARequest, _Mapping]] = ..., pooling_params: _Optional[_Union[_types_pb2.PoolingParams, _Mapping]] = ...) -> None: ...

class AddRequestResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StepRequest(_message.Message):
    __slots__ = ("max_response_bytes",)
    MAX_RESPONSE_BYTES_FIELD_NUMBER: _ClassVar[int]
    max_response_bytes: int
    def __init__(self, max_response_bytes: _Optional[int] = ...) -> None: ...

class StepResponse(_message.Message):
    __slots__ = ("outputs", "streamed_request_ids", "num_pending")
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    STREAMED_REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    NUM_PENDING_FIELD_NUMBER: _ClassVar[int]
    outputs: _containers.RepeatedCompositeFieldContainer[_types_pb2.RequestOutput]
    streamed_request_ids: _containers.RepeatedScalarFieldContainer[str]
    num_pending: int
    def __init__(self, outputs: _Optional[_Iterable[_Union[_types_pb2.RequestOutput, _Mapping]]] = ..., streamed_request_ids: _Optional[_Iterable[str]] = ..., num_pending: _Optional[int] = ...) -> None: ...

class AbortRequest(_message.Message):
    __slots__ = ("request_ids",)
    REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    request_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, request_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class AbortResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ResetPrefixCacheRequest(_message.Message):
    __slots__ = ("reset_running_requests", "reset_connector")
    RESET_RUNNING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    RESET_CONNECTOR_FIELD_NUMBER: _ClassVar[int]
    reset_running_requests: bool
    reset_connector: bool
    def __init__(self, reset_running_requests: _Optional[bool] = ..., reset_connector: _Optional[bool] = ...) -> None: ...

class ResetPrefixCacheResponse(_message.Message):
    __slots__ = ("success", "tiers", "replicas")
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    success: bool
    tiers: _containers.RepeatedCompositeFieldContainer[_types_pb2.TierReset]
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaResetPrefixCache]
    def __init__(self, success: _Optional[bool] = ..., tiers: _Optional[_Iterable[_Union[_types_pb2.TierReset, _Mapping]]] = ..., replicas: _Optional[_Iterable[_Union[ReplicaResetPrefixCache, _Mapping]]] = ...) -> None: ...

class ReplicaResetPrefixCache(_message.Message):
    __slots__ = ("engine", "success", "tiers", "error")
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    engine: str
    success: bool
    tiers: _containers.RepeatedCompositeFieldContainer[_types_pb2.TierReset]
    error: str
    def __init__(self, engine: _Optional[str] = ..., success: _Optional[bool] = ..., tiers: _Optional[_Iterable[_Union[_types_pb2.TierReset, _Mapping]]] = ..., error: _Optional[str] = ...) -> None: ...

class ReplicaKvCleared(_message.Message):
    __slots__ = ("engine", "event_id", "num_tokens_cleared", "error")
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_CLEARED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    engine: str
    event_id: str
    num_tokens_cleared: int
    error: str
    def __init__(self, engine: _Optional[str] = ..., event_id: _Optional[str] = ..., num_tokens_cleared: _Optional[int] = ..., error: _Optional[str] = ...) -> None: ...

class ReplicaKvLookup(_message.Message):
    __slots__ = ("engine", "num_cached_tokens", "error")
    class NumCachedTokensEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    NUM_CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    engine: str
    num_cached_tokens: _containers.ScalarMap[str, int]
    error: str
    def __init__(self, engine: _Optional[str] = ..., num_cached_tokens: _Optional[_Mapping[str, int]] = ..., error: _Optional[str] = ...) -> None: ...

class ReplicaInfo(_message.Message):
    __slots__ = ("engine", "healthy", "num_blocks")
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    engine: str
    healthy: bool
    num_blocks: int
    def __init__(self, engine: _Optional[str] = ..., healthy: _Optional[bool] = ..., num_blocks: _Optional[int] = ...) -> None: ...

class HasUnfinishedRequestsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HasUnfinishedRequestsResponse(_message.Message):
    __slots__ = ("value",)
    VALUE_FIELD_NUMBER: _ClassVar[int]
    value: bool
    def __init__(self, value: _Optional[bool] = ...) -> None: ...

class GetNumUnfinishedRequestsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetNumUnfinishedRequestsResponse(_message.Message):
    __slots__ = ("value",)
    VALUE_FIELD_NUMBER: _ClassVar[int]
    value: int
    def __init__(self, value: _Optional[int] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("request_id", "prompt", "params", "priority", "lora_request", "pooling_params")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    LORA_REQUEST_FIELD_NUMBER: _ClassVar[int]
    POOLING_PARAMS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prompt: _types_pb2.Prompt
    params: _types_pb2.SamplingParams
    priority: int
    lora_request: _types_pb2.LoRARequest
    pooling_params: _types_pb2.PoolingParams
    def __init__(self, request_id: _Optional[str] = ..., prompt: _Optional[_Union[_types_pb2.Prompt, _Mapping]] = ..., params: _Optional[_Union[_types_pb2.SamplingParams, _Mapping]] = ..., priority: _Optional[int] = ..., lora_request: _Optional[_Union[_types_pb2.LoRARequest, _Mapping]] = ..., pooling_params: _Optional[_Union[_types_pb2.PoolingParams, _Mapping]] = ...) -> None: ...

class GetServerInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetServerInfoResponse(_message.Message):
    __slots__ = ("model", "max_model_len", "block_size", "num_blocks", "vocab_size", "auto_step", "versions", "replicas", "dtype", "kv_cache_dtype", "labels")
    class VersionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    AUTO_STEP_FIELD_NUMBER: _ClassVar[int]
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_DTYPE_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    model: str
    max_model_len: int
    block_size: int
    num_blocks: int
    vocab_size: int
    auto_step: bool
    versions: _containers.ScalarMap[str, str]
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaInfo]
    dtype: str
    kv_cache_dtype: str
    labels: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, model: _Optional[str] = ..., max_model_len: _Optional[int] = ..., block_size: _Optional[int] = ..., num_blocks: _Optional[int] = ..., vocab_size: _Optional[int] = ..., auto_step: _Optional[bool] = ..., versions: _Optional[_Mapping[str, str]] = ..., replicas: _Optional[_Iterable[_Union[ReplicaInfo, _Mapping]]] = ..., dtype: _Optional[str] = ..., kv_cache_dtype: _Optional[str] = ..., labels: _Optional[_Iterable[str]] = ...) -> None: ...

class ClearKvCacheRequest(_message.Message):
    __slots__ = ("instance_id", "location")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    location: str
    def __init__(self, instance_id: _Optional[str] = ..., location: _Optional[str] = ...) -> None: ...

class ClearKvCacheResponse(_message.Message):
    __slots__ = ("event_id", "num_tokens_cleared", "replicas")
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_CLEARED_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    event_id: str
    num_tokens_cleared: int
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaKvCleared]
    def __init__(self, event_id: _Optional[str] = ..., num_tokens_cleared: _Optional[int] = ..., replicas: _Optional[_Iterable[_Union[ReplicaKvCleared, _Mapping]]] = ...) -> None: ...

class LookupKvCacheRequest(_message.Message):
    __slots__ = ("token_ids",)
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class LookupKvCacheResponse(_message.Message):
    __slots__ = ("num_cached_tokens", "replicas")
    class NumCachedTokensEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    NUM_CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    num_cached_tokens: _containers.ScalarMap[str, int]
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaKvLookup]
    def __init__(self, num_cached_tokens: _Optional[_Mapping[str, int]] = ..., replicas: _Optional[_Iterable[_Union[ReplicaKvLookup, _Mapping]]] = ...) -> None: ...
