"""pb <-> PoolingParams: what a pooling request asks (its output: convert_outputs.py)."""

from __future__ import annotations

from strand.engine_core.pooling.params import PoolingParams
from strand.services._proto.strand.v1 import types_pb2 as pb


def pooling_params_to_pb(params: PoolingParams) -> pb.PoolingParams:
    msg = pb.PoolingParams()
    if params.truncate_prompt_tokens is not None:
        msg.truncate_prompt_tokens = params.truncate_prompt_tokens
    if params.normalize is not None:
        msg.normalize = params.normalize
    if params.dimensions is not None:
        msg.dimensions = params.dimensions
    if params.task is not None:
        msg.task = params.task
    if params.use_activation is not None:
        msg.use_activation = params.use_activation
    return msg


def pooling_params_from_pb(msg: pb.PoolingParams) -> PoolingParams:
    """ValueError naming the field for a bad value (PoolingParams checks each)."""
    return PoolingParams(
        truncate_prompt_tokens=(msg.truncate_prompt_tokens
                                if msg.HasField("truncate_prompt_tokens") else None),
        dimensions=msg.dimensions if msg.HasField("dimensions") else None,
        normalize=msg.normalize if msg.HasField("normalize") else None,
        task=msg.task if msg.HasField("task") else None,
        use_activation=msg.use_activation if msg.HasField("use_activation") else None)
