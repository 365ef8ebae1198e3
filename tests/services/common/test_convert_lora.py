"""LoRARequest across the wire: it round-trips on EngineCoreRequest, absent stays None, and a
bad one is a ValueError (INVALID_ARGUMENT) naming the field."""

from __future__ import annotations

import pytest

from strand.engine_core import LoRARequest, SamplingParams
from strand.engine_core.core.engine_io import EngineCoreRequest
from strand.services._proto.strand.v1 import types_pb2 as pb
from strand.services.common.convert import (
    core_request_from_pb,
    core_request_to_pb,
    lora_request_from_pb,
)


def _request(lora: LoRARequest | None) -> EngineCoreRequest:
    return EngineCoreRequest("r", [1, 2, 3], SamplingParams(max_tokens=2), eos_token_id=2,
                             arrival_time=1.0, lora_request=lora)


def test_core_request_round_trips_its_adapter() -> None:
    lora = LoRARequest("sql", 3, "/adapters/sql")
    assert core_request_from_pb(core_request_to_pb(_request(lora))).lora_request == lora


def test_core_request_without_adapter_stays_base_model() -> None:
    msg = core_request_to_pb(_request(None))
    assert not msg.HasField("lora_request")
    assert core_request_from_pb(msg).lora_request is None


def test_bad_adapter_message_names_the_field() -> None:
    with pytest.raises(ValueError, match="lora_path must be a non-empty str"):
        lora_request_from_pb(pb.LoRARequest(lora_name="a", lora_int_id=1))
