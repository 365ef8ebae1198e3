"""Read a PEFT LoRA adapter directory (adapter_config.json + adapter_model.safetensors).

PEFT stores, per adapted module, lora_A [r, in] and lora_B [out, r]; the module computes
W x + scaling * B (A x), scaling = lora_alpha / r (lora_alpha / sqrt(r) with use_rslora).
The scaling is folded into B here, once, so the batched forward is two plain products.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

# HF module name -> (the fused Strand Linear under the decoder layer, the slice of its output).
TARGET_MODULES: dict[str, tuple[str, int]] = {
    "q_proj": ("self_attn.qkv_proj", 0),
    "k_proj": ("self_attn.qkv_proj", 1),
    "v_proj": ("self_attn.qkv_proj", 2),
    "o_proj": ("self_attn.o_proj", 0),
    "gate_proj": ("mlp.gate_up_proj", 0),
    "up_proj": ("mlp.gate_up_proj", 1),
    "down_proj": ("mlp.down_proj", 0),
}
CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
# ...layers.<i>.<self_attn|mlp>.<module>.lora_<A|B>[.<adapter name>].weight
_KEY = re.compile(r"(?:^|\.)layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])(?:\.\w+)?\.weight$")


@dataclass(slots=True)
class LoRAAdapter:
    lora_int_id: int
    lora_name: str
    rank: int
    # (layer index, HF module name) -> (A [rank, in], scaling * B [out, rank]), model dtype.
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]

    @property
    def num_bytes(self) -> int:
        return sum(a.nbytes + b.nbytes for a, b in self.weights.values())


def load_peft_adapter(path: str, lora_int_id: int, lora_name: str, max_lora_rank: int,
                      shapes: dict[str, tuple[int, int]], num_layers: int,
                      dtype: torch.dtype) -> LoRAAdapter:
    """shapes: HF module name -> (in_features, out_features) in the base model.

    ValueError naming the field and the bound for anything this engine cannot apply exactly.
    """
    directory = Path(path)
    config = _read_config(directory)
    rank, scaling = _rank_and_scaling(config, max_lora_rank)
    weights_path = directory / WEIGHTS_FILE
    if not weights_path.is_file():
        raise ValueError(f"lora_path {path!r} must hold {WEIGHTS_FILE}")
    tensors = load_file(str(weights_path))
    halves: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        match = _KEY.search(key)
        if match is None:
            raise ValueError(f"adapter tensor {key!r} is not a LoRA A/B weight of "
                             f"{sorted(TARGET_MODULES)} (embeddings, lm_head, DoRA and "
                             "modules_to_save are not supported)")
        layer, module, half = int(match[1]), match[2], match[3]
        if module not in shapes:
            raise ValueError(f"target_modules must be among {sorted(shapes)}, got {module!r} "
                             f"({key})")
        if not 0 <= layer < num_layers:
            raise ValueError(f"adapter tensor {key!r}: layer must be in [0, {num_layers})")
        halves.setdefault((layer, module), {})[half] = tensor
    if not halves:
        raise ValueError(f"lora_path {path!r}: {WEIGHTS_FILE} holds no LoRA weights")
    weights = {}
    for (layer, module), pair in halves.items():
        if set(pair) != {"A", "B"}:
            raise ValueError(f"layer {layer} {module}: lora_A and lora_B must both be present")
        a, b = pair["A"], pair["B"]
        in_features, out_features = shapes[module]
        if tuple(a.shape) != (rank, in_features) or tuple(b.shape) != (out_features, rank):
            raise ValueError(
                f"layer {layer} {module}: lora_A must be [r={rank}, {in_features}] and lora_B "
                f"[{out_features}, r={rank}], got {list(a.shape)} and {list(b.shape)}")
        weights[(layer, module)] = (a.to(dtype).contiguous(),
                                    (b.float() * scaling).to(dtype).contiguous())
    return LoRAAdapter(lora_int_id=lora_int_id, lora_name=lora_name, rank=rank,
                       weights=weights)


def _read_config(directory: Path) -> dict[str, Any]:
    config_path = directory / CONFIG_FILE
    if not config_path.is_file():
        raise ValueError(f"lora_path {str(directory)!r} must be a PEFT adapter directory "
                         f"holding {CONFIG_FILE}")
    try:
        config = json.loads(config_path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{config_path}: not valid JSON ({exc})") from exc
    if not isinstance(config, dict):
        raise ValueError(f"{config_path}: must be a JSON object")
    return config


def _rank_and_scaling(config: dict[str, Any], max_lora_rank: int) -> tuple[int, float]:
    peft_type = config.get("peft_type", "LORA")
    if peft_type != "LORA":
        raise ValueError(f"peft_type must be 'LORA', got {peft_type!r}")
    rank = config.get("r")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"r must be an int >= 1, got {rank!r}")
    if rank > max_lora_rank:
        raise ValueError(f"r ({rank}) must be <= max_lora_rank ({max_lora_rank})")
    alpha = config.get("lora_alpha", 8)
    if isinstance(alpha, bool) or not isinstance(alpha, int | float):
        raise ValueError(f"lora_alpha must be a number, got {alpha!r}")
    for flag in ("use_dora", "fan_in_fan_out"):
        if config.get(flag):
            raise ValueError(f"{flag} must be false: not supported")
    for pattern in ("rank_pattern", "alpha_pattern"):
        if config.get(pattern):
            raise ValueError(f"{pattern} must be empty: per-module ranks are not supported")
    if config.get("bias", "none") != "none":
        raise ValueError(f"bias must be 'none', got {config.get('bias')!r}")
    if config.get("modules_to_save"):
        raise ValueError(f"modules_to_save must be empty, got {config['modules_to_save']!r}")
    scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    return rank, float(scaling)
