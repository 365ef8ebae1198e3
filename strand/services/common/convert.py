"""Every pb <-> dataclass conversion, in one import (the modules beside it hold the code)."""

from __future__ import annotations

from strand.services.common.convert_core import (
    core_request_from_pb,
    core_request_to_pb,
    logprobs_lists_from_pb,
    logprobs_lists_to_pb,
)
from strand.services.common.convert_lora import (
    lora_request_from_pb,
    lora_request_to_pb,
    optional_lora_from_pb,
)
from strand.services.common.convert_outputs import (
    any_output_from_pb,
    completion_from_pb,
    completion_to_pb,
    metrics_from_pb,
    metrics_to_pb,
    pooling_output_to_pb,
    request_output_from_pb,
    request_output_to_pb,
)
from strand.services.common.convert_params import (
    PromptType,
    params_from_pb,
    params_to_pb,
    prompt_from_pb,
    prompt_to_pb,
)
from strand.services.common.convert_pooling import pooling_params_from_pb, pooling_params_to_pb
from strand.services.common.convert_step import core_outputs_from_pb, core_outputs_to_pb

__all__ = [
    "PromptType",
    "any_output_from_pb",
    "completion_from_pb",
    "completion_to_pb",
    "core_outputs_from_pb",
    "core_outputs_to_pb",
    "core_request_from_pb",
    "core_request_to_pb",
    "lora_request_from_pb",
    "lora_request_to_pb",
    "optional_lora_from_pb",
    "logprobs_lists_from_pb",
    "logprobs_lists_to_pb",
    "metrics_from_pb",
    "metrics_to_pb",
    "params_from_pb",
    "params_to_pb",
    "pooling_output_to_pb",
    "pooling_params_from_pb",
    "pooling_params_to_pb",
    "prompt_from_pb",
    "prompt_to_pb",
    "request_output_from_pb",
    "request_output_to_pb",
]
