"""pb <-> LoRARequest (issue 22 item 2): an unset message field means the base model."""

from __future__ import annotations

from strand.engine_core.lora.request import LoRARequest
from strand.services._proto.strand.v1 import types_pb2 as pb


def lora_request_to_pb(req: LoRARequest) -> pb.LoRARequest:
    return pb.LoRARequest(lora_name=req.lora_name, lora_int_id=req.lora_int_id,
                          lora_path=req.lora_path)


def lora_request_from_pb(msg: pb.LoRARequest) -> LoRARequest:
    """ValueError (INVALID_ARGUMENT) naming the field for an empty name or path or an id < 1."""
    return LoRARequest(lora_name=msg.lora_name, lora_int_id=int(msg.lora_int_id),
                       lora_path=msg.lora_path)


def optional_lora_from_pb(parent: object) -> LoRARequest | None:
    """parent.lora_request when the message sets it (every request message names it so)."""
    if parent.HasField("lora_request"):  # type: ignore[attr-defined]
        return lora_request_from_pb(parent.lora_request)  # type: ignore[attr-defined]
    return None
