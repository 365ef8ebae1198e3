"""A LoRA adapter's share on one tensor-parallel rank (vLLM's split, not fully sharded).

An adapted Linear computes W x + B (A x), with W ~ B A of shape [out, in]. Each rank holds the
part of W the base checkpoint gives it (shard_loading.shard_range), and the adapter follows:
  - column-parallel (q/k/v, gate/up: W's output rows split): A whole, B's rows of this rank's
    outputs, so the rank's delta is exactly its output columns' delta;
  - row-parallel (o_proj, down_proj: W's input columns split): A's columns of this rank's
    inputs, B whole, so each rank's delta is a partial sum the layer's all-reduce adds up with
    the base product's partial sums (the delta goes in before the all-reduce, summed once).
Adapters are checked against the full model's shapes, as PEFT saved them, then sliced once
when loaded.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from strand.engine_core.distributed.layers import ShardLayout
from strand.engine_core.distributed.shard_loading import shard_range
from strand.engine_core.lora.peft_adapter import LoRAAdapter
from strand.engine_core.model_executor.model_config import ModelConfig

_ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")


@dataclass(frozen=True, slots=True)
class LoRAShard:
    """What a rank's LoRAManager needs to check adapters whole and keep its part."""

    layout: ShardLayout  # this rank's part of the base model
    model_config: ModelConfig  # the full model's

    def full_shapes(self, local: dict[str, tuple[int, int]]) -> dict[str, tuple[int, int]]:
        return full_shapes(local, self.model_config)

    def shard(self, adapter: LoRAAdapter) -> LoRAAdapter:
        return shard_adapter(adapter, self.layout)


def full_shapes(local: dict[str, tuple[int, int]], config: ModelConfig
                ) -> dict[str, tuple[int, int]]:
    """The full model's (in, out) per HF module, from a rank's own (local) shapes: the split
    dimension comes from the full config (KV heads replicated on several ranks do not add up)."""
    q = config.num_heads * config.head_dim
    kv = config.num_kv_heads * config.head_dim
    split = {"q_proj": (None, q), "k_proj": (None, kv), "v_proj": (None, kv),
             "gate_proj": (None, config.intermediate_size),
             "up_proj": (None, config.intermediate_size),
             "o_proj": (q, None), "down_proj": (config.intermediate_size, None)}
    out = {}
    for module, (local_in, local_out) in local.items():
        full_in, full_out = split[module]
        out[module] = (local_in if full_in is None else full_in,
                       local_out if full_out is None else full_out)
    return out


def shard_adapter(adapter: LoRAAdapter, layout: ShardLayout) -> LoRAAdapter:
    """This rank's slices of every A [r, in] and B [out, r] (contiguous copies, so the full
    tensors are freed)."""
    weights = {}
    for (layer, module), (a, b) in adapter.weights.items():
        block = "self_attn" if module in _ATTENTION else "mlp"
        spec = shard_range(f"model.layers.{layer}.{block}.{module}.weight", layout)
        if spec is not None:
            dim, start, length = spec
            if dim == 0:  # W's rows: this rank's outputs, B's rows
                b = b.narrow(0, start, length)
            else:  # W's columns: this rank's inputs, A's columns
                a = a.narrow(1, start, length)
        weights[(layer, module)] = (a.contiguous(), b.contiguous())
    return dataclasses.replace(adapter, weights=weights)
