from strand.services._proto.strand.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EngineAddRequests(_message.Message):
    __slots__ = ("requests",)
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    requests: _containers.RepeatedCompositeFieldContainer[_types_pb2.EngineCoreRequest]
    def __init__(self, requests: _Optional[_Iterable[_Union[_types_pb2.EngineCoreRequest, _Mapping]]] = ...) -> None: ...

class EngineStep(_message.Message):
    __slots__ = ("step_id", "origin")
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    step_id: int
    origin: str
    def __init__(self, step_id: _Optional[int] = ..., origin: _Optional[str] = ...) -> None: ...

class EngineAbort(_message.Message):
    __slots__ = ("request_ids",)
    REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    request_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, request_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class EngineResetPrefixCache(_message.Message):
    __slots__ = ("reset_running_requests", "reset_connector")
    RESET_RUNNING_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    RESET_CONNECTOR_FIELD_NUMBER: _ClassVar[int]
    reset_running_requests: bool
    reset_connector: bool
    def __init__(self, reset_running_requests: _Optional[bool] = ..., reset_connector: _Optional[bool] = ...) -> None: ...

class EngineQuery(_message.Message):
    __slots__ = ("request_ids",)
    REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    request_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, request_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class EngineClearKvCache(_message.Message):
    __slots__ = ("instance_id", "location")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    LOCATION_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    location: str
    def __init__(self, instance_id: _Optional[str] = ..., location: _Optional[str] = ...) -> None: ...

class EngineLookupKvCache(_message.Message):
    __slots__ = ("token_ids",)
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class EngineGetLoads(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class EngineTakeKvEvents(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class EngineSleep(_message.Message):
    __slots__ = ("level",)
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    level: int
    def __init__(self, level: _Optional[int] = ...) -> None: ...

class EngineWakeUp(_message.Message):
    __slots__ = ("tags",)
    TAGS_FIELD_NUMBER: _ClassVar[int]
    tags: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, tags: _Optional[_Iterable[str]] = ...) -> None: ...

class EngineProfile(_message.Message):
    __slots__ = ("start",)
    START_FIELD_NUMBER: _ClassVar[int]
    start: bool
    def __init__(self, start: _Optional[bool] = ...) -> None: ...

class EngineRequest(_message.Message):
    __slots__ = ("seq", "trace_context", "add", "step", "abort", "reset_prefix_cache", "query", "clear_kv_cache", "lookup_kv_cache", "get_loads", "take_kv_events", "sleep", "wake_up", "profile", "lora")
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
    STEP_FIELD_NUMBER: _ClassVar[int]
    ABORT_FIELD_NUMBER: _ClassVar[int]
    RESET_PREFIX_CACHE_FIELD_NUMBER: _ClassVar[int]
    QUERY_FIELD_NUMBER: _ClassVar[int]
    CLEAR_KV_CACHE_FIELD_NUMBER: _ClassVar[int]
    LOOKUP_KV_CACHE_FIELD_NUMBER: _ClassVar[int]
    GET_LOADS_FIELD_NUMBER: _ClassVar[int]
    TAKE_KV_EVENTS_FIELD_NUMBER: _ClassVar[int]
    SLEEP_FIELD_NUMBER: _ClassVar[int]
    WAKE_UP_FIELD_NUMBER: _ClassVar[int]
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    LORA_FIELD_NUMBER: _ClassVar[int]
    seq: int
    trace_context: _containers.ScalarMap[str, str]
    add: EngineAddRequests
    step: EngineStep
    abort: EngineAbort
    reset_prefix_cache: EngineResetPrefixCache
    query: EngineQuery
    clear_kv_cache: EngineClearKvCache
    lookup_kv_cache: EngineLookupKvCache
    get_loads: EngineGetLoads
    take_kv_events: EngineTakeKvEvents
    sleep: EngineSleep
    wake_up: EngineWakeUp
    profile: EngineProfile
    lora: EngineLoraCall
    def __init__(self, seq: _Optional[int] = ..., trace_context: _Optional[_Mapping[str, str]] = ..., add: _Optional[_Union[EngineAddRequests, _Mapping]] = ..., step: _Optional[_Union[EngineStep, _Mapping]] = ..., abort: _Optional[_Union[EngineAbort, _Mapping]] = ..., reset_prefix_cache: _Optional[_Union[EngineResetPrefixCache, _Mapping]] = ..., query: _Optional[_Union[EngineQuery, _Mapping]] = ..., clear_kv_cache: _Optional[_Union[EngineClearKvCache, _Mapping]] = ..., lookup_kv_cache: _Optional[_Union[EngineLookupKvCache, _Mapping]] = ..., get_loads: _Optional[_Union[EngineGetLoads, _Mapping]] = ..., take_kv_events: _Optional[_Union[EngineTakeKvEvents, _Mapping]] = ..., sleep: _Optional[_Union[EngineSleep, _Mapping]] = ..., wake_up: _Optional[_Union[EngineWakeUp, _Mapping]] = ..., profile: _Optional[_Union[EngineProfile, _Mapping]] = ..., lora: _Optional[_Union[EngineLoraCall, _Mapping]] = ...) -> None: ...

class EngineLoraCall(_message.Message):
    __slots__ = ("add", "remove", "list", "pin")
    class List(_message.Message):
        __slots__ = ()
        def __init__(self) -> None: ...
    ADD_FIELD_NUMBER: _ClassVar[int]
    REMOVE_FIELD_NUMBER: _ClassVar[int]
    LIST_FIELD_NUMBER: _ClassVar[int]
    PIN_FIELD_NUMBER: _ClassVar[int]
    add: _types_pb2.LoRARequest
    remove: int
    list: EngineLoraCall.List
    pin: int
    def __init__(self, add: _Optional[_Union[_types_pb2.LoRARequest, _Mapping]] = ..., remove: _Optional[int] = ..., list: _Optional[_Union[EngineLoraCall.List, _Mapping]] = ..., pin: _Optional[int] = ...) -> None: ...

class EngineLoraResult(_message.Message):
    __slots__ = ("success", "lora_ids")
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    LORA_IDS_FIELD_NUMBER: _ClassVar[int]
    success: bool
    lora_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, success: _Optional[bool] = ..., lora_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class EngineState(_message.Message):
    __slots__ = ("num_unfinished_requests", "reset_ok", "tiers", "is_sleeping", "supported_tasks", "profile_path", "missing_request_ids")
    NUM_UNFINISHED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    RESET_OK_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    IS_SLEEPING_FIELD_NUMBER: _ClassVar[int]
    SUPPORTED_TASKS_FIELD_NUMBER: _ClassVar[int]
    PROFILE_PATH_FIELD_NUMBER: _ClassVar[int]
    MISSING_REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    num_unfinished_requests: int
    reset_ok: bool
    tiers: _containers.RepeatedCompositeFieldContainer[_types_pb2.TierReset]
    is_sleeping: bool
    supported_tasks: _containers.RepeatedScalarFieldContainer[str]
    profile_path: str
    missing_request_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, num_unfinished_requests: _Optional[int] = ..., reset_ok: _Optional[bool] = ..., tiers: _Optional[_Iterable[_Union[_types_pb2.TierReset, _Mapping]]] = ..., is_sleeping: _Optional[bool] = ..., supported_tasks: _Optional[_Iterable[str]] = ..., profile_path: _Optional[str] = ..., missing_request_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class KvCacheCleared(_message.Message):
    __slots__ = ("event_id", "num_tokens_cleared")
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_CLEARED_FIELD_NUMBER: _ClassVar[int]
    event_id: str
    num_tokens_cleared: int
    def __init__(self, event_id: _Optional[str] = ..., num_tokens_cleared: _Optional[int] = ...) -> None: ...

class KvCacheLookup(_message.Message):
    __slots__ = ("num_cached_tokens",)
    class NumCachedTokensEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    NUM_CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    num_cached_tokens: _containers.ScalarMap[str, int]
    def __init__(self, num_cached_tokens: _Optional[_Mapping[str, int]] = ...) -> None: ...

class EngineResponse(_message.Message):
    __slots__ = ("seq", "state", "error", "cleared", "lookup", "load", "kv_events_batches", "lora")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    CLEARED_FIELD_NUMBER: _ClassVar[int]
    LOOKUP_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    KV_EVENTS_BATCHES_FIELD_NUMBER: _ClassVar[int]
    LORA_FIELD_NUMBER: _ClassVar[int]
    seq: int
    state: EngineState
    error: _types_pb2.StageError
    cleared: KvCacheCleared
    lookup: KvCacheLookup
    load: _types_pb2.EngineLoad
    kv_events_batches: KvEventBatches
    lora: EngineLoraResult
    def __init__(self, seq: _Optional[int] = ..., state: _Optional[_Union[EngineState, _Mapping]] = ..., error: _Optional[_Union[_types_pb2.StageError, _Mapping]] = ..., cleared: _Optional[_Union[KvCacheCleared, _Mapping]] = ..., lookup: _Optional[_Union[KvCacheLookup, _Mapping]] = ..., load: _Optional[_Union[_types_pb2.EngineLoad, _Mapping]] = ..., kv_events_batches: _Optional[_Union[KvEventBatches, _Mapping]] = ..., lora: _Optional[_Union[EngineLoraResult, _Mapping]] = ...) -> None: ...

class EngineOutputsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class EngineStepOutputs(_message.Message):
    __slots__ = ("step_id", "origin", "outputs", "subscribed", "trace_context")
    class TraceContextEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBED_FIELD_NUMBER: _ClassVar[int]
    TRACE_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    step_id: int
    origin: str
    outputs: _types_pb2.EngineCoreOutputs
    subscribed: bool
    trace_context: _containers.ScalarMap[str, str]
    def __init__(self, step_id: _Optional[int] = ..., origin: _Optional[str] = ..., outputs: _Optional[_Union[_types_pb2.EngineCoreOutputs, _Mapping]] = ..., subscribed: _Optional[bool] = ..., trace_context: _Optional[_Mapping[str, str]] = ...) -> None: ...

class EngineKvEventsRequest(_message.Message):
    __slots__ = ("start_seq", "epoch")
    START_SEQ_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    start_seq: int
    epoch: str
    def __init__(self, start_seq: _Optional[int] = ..., epoch: _Optional[str] = ...) -> None: ...

class EngineKvEvents(_message.Message):
    __slots__ = ("subscribed", "snapshot_block_hashes", "snapshot_next_seq", "batch", "epoch", "resumed")
    SUBSCRIBED_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_NEXT_SEQ_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    RESUMED_FIELD_NUMBER: _ClassVar[int]
    subscribed: bool
    snapshot_block_hashes: _containers.RepeatedScalarFieldContainer[bytes]
    snapshot_next_seq: int
    batch: _types_pb2.KvEventBatch
    epoch: str
    resumed: bool
    def __init__(self, subscribed: _Optional[bool] = ..., snapshot_block_hashes: _Optional[_Iterable[bytes]] = ..., snapshot_next_seq: _Optional[int] = ..., batch: _Optional[_Union[_types_pb2.KvEventBatch, _Mapping]] = ..., epoch: _Optional[str] = ..., resumed: _Optional[bool] = ...) -> None: ...

class KvEventBatches(_message.Message):
    __slots__ = ("batches",)
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    batches: _containers.RepeatedCompositeFieldContainer[_types_pb2.KvEventBatch]
    def __init__(self, batches: _Optional[_Iterable[_Union[_types_pb2.KvEventBatch, _Mapping]]] = ...) -> None: ...

class EngineInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class EngineInfo(_message.Message):
    __slots__ = ("model", "max_model_len", "block_size", "num_blocks", "vocab_size", "auto_step", "dtype", "kv_cache_dtype", "labels")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    AUTO_STEP_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_DTYPE_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    model: str
    max_model_len: int
    block_size: int
    num_blocks: int
    vocab_size: int
    auto_step: bool
    dtype: str
    kv_cache_dtype: str
    labels: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, model: _Optional[str] = ..., max_model_len: _Optional[int] = ..., block_size: _Optional[int] = ..., num_blocks: _Optional[int] = ..., vocab_size: _Optional[int] = ..., auto_step: _Optional[bool] = ..., dtype: _Optional[str] = ..., kv_cache_dtype: _Optional[str] = ..., labels: _Optional[_Iterable[str]] = ...) -> None: ...
