from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RequestOutputKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CUMULATIVE: _ClassVar[RequestOutputKind]
    DELTA: _ClassVar[RequestOutputKind]
    FINAL_ONLY: _ClassVar[RequestOutputKind]
CUMULATIVE: RequestOutputKind
DELTA: RequestOutputKind
FINAL_ONLY: RequestOutputKind

class SamplingParams(_message.Message):
    __slots__ = ("n", "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty", "seed", "max_tokens", "max_tokens_unlimited", "min_tokens", "stop", "stop_token_ids", "include_stop_str_in_output", "ignore_eos", "logprobs", "prompt_logprobs", "logit_bias", "allowed_token_ids", "skip_special_tokens", "spaces_between_special_tokens", "output_kind", "bad_words", "bad_words_token_ids", "detokenize", "truncate_prompt_tokens", "extra_args_json", "structured_outputs")
    class LogitBiasEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: float
        def __init__(self, key: _Optional[int] = ..., value: _Optional[float] = ...) -> None: ...
    N_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_UNLIMITED_FIELD_NUMBER: _ClassVar[int]
    MIN_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_STOP_STR_IN_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    LOGIT_BIAS_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SKIP_SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SPACES_BETWEEN_SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_KIND_FIELD_NUMBER: _ClassVar[int]
    BAD_WORDS_FIELD_NUMBER: _ClassVar[int]
    BAD_WORDS_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    DETOKENIZE_FIELD_NUMBER: _ClassVar[int]
    TRUNCATE_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    EXTRA_ARGS_JSON_FIELD_NUMBER: _ClassVar[int]
    STRUCTURED_OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    n: int
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    presence_penalty: float
    frequency_penalty: float
    repetition_penalty: float
    seed: int
    max_tokens: int
    max_tokens_unlimited: bool
    min_tokens: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    include_stop_str_in_output: bool
    ignore_eos: bool
    logprobs: int
    prompt_logprobs: int
    logit_bias: _containers.ScalarMap[int, float]
    allowed_token_ids: _containers.RepeatedScalarFieldContainer[int]
    skip_special_tokens: bool
    spaces_between_special_tokens: bool
    output_kind: RequestOutputKind
    bad_words: _containers.RepeatedScalarFieldContainer[str]
    bad_words_token_ids: _containers.RepeatedCompositeFieldContainer[TokenIds]
    detokenize: bool
    truncate_prompt_tokens: int
    extra_args_json: str
    structured_outputs: StructuredOutputsParams
    def __init__(self, n: _Optional[int] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., top_k: _Optional[int] = ..., min_p: _Optional[float] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., repetition_penalty: _Optional[float] = ..., seed: _Optional[int] = ..., max_tokens: _Optional[int] = ..., max_tokens_unlimited: _Optional[bool] = ..., min_tokens: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., include_stop_str_in_output: _Optional[bool] = ..., ignore_eos: _Optional[bool] = ..., logprobs: _Optional[int] = ..., prompt_logprobs: _Optional[int] = ..., logit_bias: _Optional[_Mapping[int, float]] = ..., allowed_token_ids: _Optional[_Iterable[int]] = ..., skip_special_tokens: _Optional[bool] = ..., spaces_between_special_tokens: _Optional[bool] = ..., output_kind: _Optional[_Union[RequestOutputKind, str]] = ..., bad_words: _Optional[_Iterable[str]] = ..., bad_words_token_ids: _Optional[_Iterable[_Union[TokenIds, _Mapping]]] = ..., detokenize: _Optional[bool] = ..., truncate_prompt_tokens: _Optional[int] = ..., extra_args_json: _Optional[str] = ..., structured_outputs: _Optional[_Union[StructuredOutputsParams, _Mapping]] = ...) -> None: ...

class PoolingParams(_message.Message):
    __slots__ = ("truncate_prompt_tokens", "normalize", "dimensions", "task", "use_activation")
    TRUNCATE_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NORMALIZE_FIELD_NUMBER: _ClassVar[int]
    DIMENSIONS_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    USE_ACTIVATION_FIELD_NUMBER: _ClassVar[int]
    truncate_prompt_tokens: int
    normalize: bool
    dimensions: int
    task: str
    use_activation: bool
    def __init__(self, truncate_prompt_tokens: _Optional[int] = ..., normalize: _Optional[bool] = ..., dimensions: _Optional[int] = ..., task: _Optional[str] = ..., use_activation: _Optional[bool] = ...) -> None: ...

class Embedding(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, values: _Optional[_Iterable[float]] = ...) -> None: ...

class StructuredOutputsParams(_message.Message):
    __slots__ = ("json", "regex", "choice", "grammar", "json_object", "disable_any_whitespace", "reasoning_end")
    JSON_FIELD_NUMBER: _ClassVar[int]
    REGEX_FIELD_NUMBER: _ClassVar[int]
    CHOICE_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_FIELD_NUMBER: _ClassVar[int]
    JSON_OBJECT_FIELD_NUMBER: _ClassVar[int]
    DISABLE_ANY_WHITESPACE_FIELD_NUMBER: _ClassVar[int]
    REASONING_END_FIELD_NUMBER: _ClassVar[int]
    json: str
    regex: str
    choice: Choices
    grammar: str
    json_object: bool
    disable_any_whitespace: bool
    reasoning_end: str
    def __init__(self, json: _Optional[str] = ..., regex: _Optional[str] = ..., choice: _Optional[_Union[Choices, _Mapping]] = ..., grammar: _Optional[str] = ..., json_object: _Optional[bool] = ..., disable_any_whitespace: _Optional[bool] = ..., reasoning_end: _Optional[str] = ...) -> None: ...

class Choices(_message.Message):
    __slots__ = ("choices",)
    CHOICES_FIELD_NUMBER: _ClassVar[int]
    choices: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, choices: _Optional[_Iterable[str]] = ...) -> None: ...

class TokenIds(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ids: _Optional[_Iterable[int]] = ...) -> None: ...

class ChatMessage(_message.Message):
    __slots__ = ("role", "content", "tool_calls_json", "tool_call_id", "name", "reasoning")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_JSON_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    REASONING_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    tool_calls_json: str
    tool_call_id: str
    name: str
    reasoning: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ..., tool_calls_json: _Optional[str] = ..., tool_call_id: _Optional[str] = ..., name: _Optional[str] = ..., reasoning: _Optional[str] = ...) -> None: ...

class ChatMessages(_message.Message):
    __slots__ = ("messages", "add_generation_prompt", "tools_json", "template_kwargs_json", "continue_final_message")
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    ADD_GENERATION_PROMPT_FIELD_NUMBER: _ClassVar[int]
    TOOLS_JSON_FIELD_NUMBER: _ClassVar[int]
    TEMPLATE_KWARGS_JSON_FIELD_NUMBER: _ClassVar[int]
    CONTINUE_FINAL_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    add_generation_prompt: bool
    tools_json: str
    template_kwargs_json: str
    continue_final_message: bool
    def __init__(self, messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ..., add_generation_prompt: _Optional[bool] = ..., tools_json: _Optional[str] = ..., template_kwargs_json: _Optional[str] = ..., continue_final_message: _Optional[bool] = ...) -> None: ...

class Prompt(_message.Message):
    __slots__ = ("text", "token_ids", "chat", "cache_salt", "token_ids_text", "text_pair")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    CHAT_FIELD_NUMBER: _ClassVar[int]
    CACHE_SALT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_TEXT_FIELD_NUMBER: _ClassVar[int]
    TEXT_PAIR_FIELD_NUMBER: _ClassVar[int]
    text: str
    token_ids: TokenIds
    chat: ChatMessages
    cache_salt: str
    token_ids_text: str
    text_pair: str
    def __init__(self, text: _Optional[str] = ..., token_ids: _Optional[_Union[TokenIds, _Mapping]] = ..., chat: _Optional[_Union[ChatMessages, _Mapping]] = ..., cache_salt: _Optional[str] = ..., token_ids_text: _Optional[str] = ..., text_pair: _Optional[str] = ...) -> None: ...

class TokenizeRequest(_message.Message):
    __slots__ = ("prompt", "add_special_tokens", "return_token_strs")
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    ADD_SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RETURN_TOKEN_STRS_FIELD_NUMBER: _ClassVar[int]
    prompt: Prompt
    add_special_tokens: bool
    return_token_strs: bool
    def __init__(self, prompt: _Optional[_Union[Prompt, _Mapping]] = ..., add_special_tokens: _Optional[bool] = ..., return_token_strs: _Optional[bool] = ...) -> None: ...

class TokenizeResponse(_message.Message):
    __slots__ = ("tokens", "count", "max_model_len", "token_strs")
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    TOKEN_STRS_FIELD_NUMBER: _ClassVar[int]
    tokens: _containers.RepeatedScalarFieldContainer[int]
    count: int
    max_model_len: int
    token_strs: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, tokens: _Optional[_Iterable[int]] = ..., count: _Optional[int] = ..., max_model_len: _Optional[int] = ..., token_strs: _Optional[_Iterable[str]] = ...) -> None: ...

class DetokenizeRequest(_message.Message):
    __slots__ = ("tokens",)
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    tokens: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, tokens: _Optional[_Iterable[int]] = ...) -> None: ...

class DetokenizeResponse(_message.Message):
    __slots__ = ("prompt",)
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    prompt: str
    def __init__(self, prompt: _Optional[str] = ...) -> None: ...

class EngineCoreRequest(_message.Message):
    __slots__ = ("request_id", "prompt_token_ids", "sampling_params", "eos_token_id", "arrival_time", "priority", "cache_salt", "lora_request", "pooling_params", "deadline")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_PARAMS_FIELD_NUMBER: _ClassVar[int]
    EOS_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    ARRIVAL_TIME_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    CACHE_SALT_FIELD_NUMBER: _ClassVar[int]
    LORA_REQUEST_FIELD_NUMBER: _ClassVar[int]
    POOLING_PARAMS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    sampling_params: SamplingParams
    eos_token_id: int
    arrival_time: float
    priority: int
    cache_salt: str
    lora_request: LoRARequest
    pooling_params: PoolingParams
    deadline: float
    def __init__(self, request_id: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., sampling_params: _Optional[_Union[SamplingParams, _Mapping]] = ..., eos_token_id: _Optional[int] = ..., arrival_time: _Optional[float] = ..., priority: _Optional[int] = ..., cache_salt: _Optional[str] = ..., lora_request: _Optional[_Union[LoRARequest, _Mapping]] = ..., pooling_params: _Optional[_Union[PoolingParams, _Mapping]] = ..., deadline: _Optional[float] = ...) -> None: ...

class LoRARequest(_message.Message):
    __slots__ = ("lora_name", "lora_int_id", "lora_path")
    LORA_NAME_FIELD_NUMBER: _ClassVar[int]
    LORA_INT_ID_FIELD_NUMBER: _ClassVar[int]
    LORA_PATH_FIELD_NUMBER: _ClassVar[int]
    lora_name: str
    lora_int_id: int
    lora_path: str
    def __init__(self, lora_name: _Optional[str] = ..., lora_int_id: _Optional[int] = ..., lora_path: _Optional[str] = ...) -> None: ...

class LogprobsLists(_message.Message):
    __slots__ = ("token_ids", "logprobs", "row_lengths", "sampled_token_ranks")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    ROW_LENGTHS_FIELD_NUMBER: _ClassVar[int]
    SAMPLED_TOKEN_RANKS_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    logprobs: _containers.RepeatedScalarFieldContainer[float]
    row_lengths: _containers.RepeatedScalarFieldContainer[int]
    sampled_token_ranks: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., logprobs: _Optional[_Iterable[float]] = ..., row_lengths: _Optional[_Iterable[int]] = ..., sampled_token_ranks: _Optional[_Iterable[int]] = ...) -> None: ...

class EngineCoreOutputExtras(_message.Message):
    __slots__ = ("index", "new_logprobs", "new_prompt_logprobs", "finish_reason", "stop_token_id", "stop_str", "first_scheduled_time", "preempted_times", "held_times", "pooling_output")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    NEW_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    NEW_PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    STOP_STR_FIELD_NUMBER: _ClassVar[int]
    FIRST_SCHEDULED_TIME_FIELD_NUMBER: _ClassVar[int]
    PREEMPTED_TIMES_FIELD_NUMBER: _ClassVar[int]
    HELD_TIMES_FIELD_NUMBER: _ClassVar[int]
    POOLING_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    index: int
    new_logprobs: LogprobsLists
    new_prompt_logprobs: LogprobsLists
    finish_reason: str
    stop_token_id: int
    stop_str: str
    first_scheduled_time: float
    preempted_times: _containers.RepeatedScalarFieldContainer[float]
    held_times: _containers.RepeatedScalarFieldContainer[float]
    pooling_output: Embedding
    def __init__(self, index: _Optional[int] = ..., new_logprobs: _Optional[_Union[LogprobsLists, _Mapping]] = ..., new_prompt_logprobs: _Optional[_Union[LogprobsLists, _Mapping]] = ..., finish_reason: _Optional[str] = ..., stop_token_id: _Optional[int] = ..., stop_str: _Optional[str] = ..., first_scheduled_time: _Optional[float] = ..., preempted_times: _Optional[_Iterable[float]] = ..., held_times: _Optional[_Iterable[float]] = ..., pooling_output: _Optional[_Union[Embedding, _Mapping]] = ...) -> None: ...

class SchedulerStats(_message.Message):
    __slots__ = ("values",)
    class ValuesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.ScalarMap[str, float]
    def __init__(self, values: _Optional[_Mapping[str, float]] = ...) -> None: ...

class EngineCoreOutputs(_message.Message):
    __slots__ = ("finished_requests", "timestamp", "scheduler_stats", "request_ids", "num_new_tokens", "new_token_ids", "num_cached_tokens", "extras")
    FINISHED_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    SCHEDULER_STATS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_IDS_FIELD_NUMBER: _ClassVar[int]
    NUM_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NEW_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    NUM_CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    EXTRAS_FIELD_NUMBER: _ClassVar[int]
    finished_requests: _containers.RepeatedScalarFieldContainer[str]
    timestamp: float
    scheduler_stats: SchedulerStats
    request_ids: _containers.RepeatedScalarFieldContainer[str]
    num_new_tokens: _containers.RepeatedScalarFieldContainer[int]
    new_token_ids: _containers.RepeatedScalarFieldContainer[int]
    num_cached_tokens: _containers.RepeatedScalarFieldContainer[int]
    extras: _containers.RepeatedCompositeFieldContainer[EngineCoreOutputExtras]
    def __init__(self, finished_requests: _Optional[_Iterable[str]] = ..., timestamp: _Optional[float] = ..., scheduler_stats: _Optional[_Union[SchedulerStats, _Mapping]] = ..., request_ids: _Optional[_Iterable[str]] = ..., num_new_tokens: _Optional[_Iterable[int]] = ..., new_token_ids: _Optional[_Iterable[int]] = ..., num_cached_tokens: _Optional[_Iterable[int]] = ..., extras: _Optional[_Iterable[_Union[EngineCoreOutputExtras, _Mapping]]] = ...) -> None: ...

class Logprob(_message.Message):
    __slots__ = ("logprob", "rank", "decoded_token")
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    DECODED_TOKEN_FIELD_NUMBER: _ClassVar[int]
    logprob: float
    rank: int
    decoded_token: str
    def __init__(self, logprob: _Optional[float] = ..., rank: _Optional[int] = ..., decoded_token: _Optional[str] = ...) -> None: ...

class LogprobEntry(_message.Message):
    __slots__ = ("token_id", "logprob")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    logprob: Logprob
    def __init__(self, token_id: _Optional[int] = ..., logprob: _Optional[_Union[Logprob, _Mapping]] = ...) -> None: ...

class LogprobPosition(_message.Message):
    __slots__ = ("entries", "absent")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    ABSENT_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[LogprobEntry]
    absent: bool
    def __init__(self, entries: _Optional[_Iterable[_Union[LogprobEntry, _Mapping]]] = ..., absent: _Optional[bool] = ...) -> None: ...

class PositionLogprobs(_message.Message):
    __slots__ = ("positions",)
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    positions: _containers.RepeatedCompositeFieldContainer[LogprobPosition]
    def __init__(self, positions: _Optional[_Iterable[_Union[LogprobPosition, _Mapping]]] = ...) -> None: ...

class RequestMetrics(_message.Message):
    __slots__ = ("arrival_time", "first_scheduled_time", "first_token_time", "last_token_time", "finished_time", "preemption_times")
    ARRIVAL_TIME_FIELD_NUMBER: _ClassVar[int]
    FIRST_SCHEDULED_TIME_FIELD_NUMBER: _ClassVar[int]
    FIRST_TOKEN_TIME_FIELD_NUMBER: _ClassVar[int]
    LAST_TOKEN_TIME_FIELD_NUMBER: _ClassVar[int]
    FINISHED_TIME_FIELD_NUMBER: _ClassVar[int]
    PREEMPTION_TIMES_FIELD_NUMBER: _ClassVar[int]
    arrival_time: float
    first_scheduled_time: float
    first_token_time: float
    last_token_time: float
    finished_time: float
    preemption_times: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, arrival_time: _Optional[float] = ..., first_scheduled_time: _Optional[float] = ..., first_token_time: _Optional[float] = ..., last_token_time: _Optional[float] = ..., finished_time: _Optional[float] = ..., preemption_times: _Optional[_Iterable[float]] = ...) -> None: ...

class CompletionOutput(_message.Message):
    __slots__ = ("index", "text", "token_ids", "cumulative_logprob", "logprobs", "finish_reason", "stop_token_id", "stop_str")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    CUMULATIVE_LOGPROB_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    STOP_STR_FIELD_NUMBER: _ClassVar[int]
    index: int
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    cumulative_logprob: float
    logprobs: PositionLogprobs
    finish_reason: str
    stop_token_id: int
    stop_str: str
    def __init__(self, index: _Optional[int] = ..., text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., cumulative_logprob: _Optional[float] = ..., logprobs: _Optional[_Union[PositionLogprobs, _Mapping]] = ..., finish_reason: _Optional[str] = ..., stop_token_id: _Optional[int] = ..., stop_str: _Optional[str] = ...) -> None: ...

class RequestOutput(_message.Message):
    __slots__ = ("request_id", "prompt", "prompt_token_ids", "outputs", "finished", "prompt_logprobs", "num_cached_tokens", "metrics", "error", "extra_json", "lora_request", "embedding")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_FIELD_NUMBER: _ClassVar[int]
    PROMPT_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    NUM_CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    EXTRA_JSON_FIELD_NUMBER: _ClassVar[int]
    LORA_REQUEST_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prompt: str
    prompt_token_ids: _containers.RepeatedScalarFieldContainer[int]
    outputs: _containers.RepeatedCompositeFieldContainer[CompletionOutput]
    finished: bool
    prompt_logprobs: PositionLogprobs
    num_cached_tokens: int
    metrics: RequestMetrics
    error: str
    extra_json: str
    lora_request: LoRARequest
    embedding: Embedding
    def __init__(self, request_id: _Optional[str] = ..., prompt: _Optional[str] = ..., prompt_token_ids: _Optional[_Iterable[int]] = ..., outputs: _Optional[_Iterable[_Union[CompletionOutput, _Mapping]]] = ..., finished: _Optional[bool] = ..., prompt_logprobs: _Optional[_Union[PositionLogprobs, _Mapping]] = ..., num_cached_tokens: _Optional[int] = ..., metrics: _Optional[_Union[RequestMetrics, _Mapping]] = ..., error: _Optional[str] = ..., extra_json: _Optional[str] = ..., lora_request: _Optional[_Union[LoRARequest, _Mapping]] = ..., embedding: _Optional[_Union[Embedding, _Mapping]] = ...) -> None: ...

class StageError(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...

class ProcessedPrompt(_message.Message):
    __slots__ = ("request", "prompt")
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    request: EngineCoreRequest
    prompt: str
    def __init__(self, request: _Optional[_Union[EngineCoreRequest, _Mapping]] = ..., prompt: _Optional[str] = ...) -> None: ...

class TierReset(_message.Message):
    __slots__ = ("tier", "reset", "num_blocks", "num_bytes")
    TIER_FIELD_NUMBER: _ClassVar[int]
    RESET_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_BYTES_FIELD_NUMBER: _ClassVar[int]
    tier: str
    reset: bool
    num_blocks: int
    num_bytes: int
    def __init__(self, tier: _Optional[str] = ..., reset: _Optional[bool] = ..., num_blocks: _Optional[int] = ..., num_bytes: _Optional[int] = ...) -> None: ...

class EngineLoad(_message.Message):
    __slots__ = ("engine", "num_running", "num_waiting", "kv_blocks_used", "kv_blocks_free", "tokens_in_flight", "prefix_cache_queries", "prefix_cache_hits")
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    NUM_RUNNING_FIELD_NUMBER: _ClassVar[int]
    NUM_WAITING_FIELD_NUMBER: _ClassVar[int]
    KV_BLOCKS_USED_FIELD_NUMBER: _ClassVar[int]
    KV_BLOCKS_FREE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHE_QUERIES_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHE_HITS_FIELD_NUMBER: _ClassVar[int]
    engine: str
    num_running: int
    num_waiting: int
    kv_blocks_used: int
    kv_blocks_free: int
    tokens_in_flight: int
    prefix_cache_queries: int
    prefix_cache_hits: int
    def __init__(self, engine: _Optional[str] = ..., num_running: _Optional[int] = ..., num_waiting: _Optional[int] = ..., kv_blocks_used: _Optional[int] = ..., kv_blocks_free: _Optional[int] = ..., tokens_in_flight: _Optional[int] = ..., prefix_cache_queries: _Optional[int] = ..., prefix_cache_hits: _Optional[int] = ...) -> None: ...

class KvEvent(_message.Message):
    __slots__ = ("block_stored", "block_removed", "all_blocks_cleared")
    BLOCK_STORED_FIELD_NUMBER: _ClassVar[int]
    BLOCK_REMOVED_FIELD_NUMBER: _ClassVar[int]
    ALL_BLOCKS_CLEARED_FIELD_NUMBER: _ClassVar[int]
    block_stored: BlockStored
    block_removed: BlockRemoved
    all_blocks_cleared: AllBlocksCleared
    def __init__(self, block_stored: _Optional[_Union[BlockStored, _Mapping]] = ..., block_removed: _Optional[_Union[BlockRemoved, _Mapping]] = ..., all_blocks_cleared: _Optional[_Union[AllBlocksCleared, _Mapping]] = ...) -> None: ...

class BlockStored(_message.Message):
    __slots__ = ("block_hashes", "parent_block_hash", "token_ids", "block_size")
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    PARENT_BLOCK_HASH_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    block_hashes: _containers.RepeatedScalarFieldContainer[bytes]
    parent_block_hash: bytes
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    block_size: int
    def __init__(self, block_hashes: _Optional[_Iterable[bytes]] = ..., parent_block_hash: _Optional[bytes] = ..., token_ids: _Optional[_Iterable[int]] = ..., block_size: _Optional[int] = ...) -> None: ...

class BlockRemoved(_message.Message):
    __slots__ = ("block_hashes",)
    BLOCK_HASHES_FIELD_NUMBER: _ClassVar[int]
    block_hashes: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, block_hashes: _Optional[_Iterable[bytes]] = ...) -> None: ...

class AllBlocksCleared(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class KvEventBatch(_message.Message):
    __slots__ = ("seq", "timestamp", "events", "engine", "epoch", "snapshot")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    seq: int
    timestamp: float
    events: _containers.RepeatedCompositeFieldContainer[KvEvent]
    engine: str
    epoch: str
    snapshot: bool
    def __init__(self, seq: _Optional[int] = ..., timestamp: _Optional[float] = ..., events: _Optional[_Iterable[_Union[KvEvent, _Mapping]]] = ..., engine: _Optional[str] = ..., epoch: _Optional[str] = ..., snapshot: _Optional[bool] = ...) -> None: ...
