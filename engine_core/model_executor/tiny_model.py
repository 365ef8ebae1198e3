"""make_tiny_model: a complete, seeded, random HF-format model directory, made without transformers.

config.json, model.safetensors (HF tensor names), generation_config.json and (optionally) a BPE
tokenizer trained on generated text. Tests, the demo and the benchmarks all build their models here.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

ARCHITECTURES = {"llama": ("LlamaForCausalLM", "llama"),
                 "mistral": ("MistralForCausalLM", "mistral"),
                 "qwen2": ("Qwen2ForCausalLM", "qwen2")}
BOS_TOKEN_ID = 1  # the tiny tokenizer's ids: <unk>=0, <s>=1, </s>=2
EOS_TOKEN_ID = 2
LLAMA3_ROPE_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                       "high_freq_factor": 4.0, "original_max_position_embeddings": 256}
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def make_tiny_model(
    out_dir: str | Path,
    arch: str = "llama",
    num_layers: int = 2,
    hidden_size: int = 64,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    vocab_size: int = 512,
    *,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 2048,
    tie_word_embeddings: bool = False,
    rope_scaling: dict[str, Any] | None = None,
    rope_theta: float = 10000.0,
    dtype: str = "float32",
    num_shards: int = 1,
    seed: int = 0,
    with_tokenizer: bool = True,
) -> Path:
    """Write the directory and return its path. ValueError naming the bad argument."""
    _validate(arch, num_layers, hidden_size, num_heads, num_kv_heads, vocab_size, dtype, num_shards)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    intermediate = intermediate_size or 2 * hidden_size
    config = _config(arch, num_layers, hidden_size, num_heads, num_kv_heads, vocab_size,
                     intermediate, max_position_embeddings, tie_word_embeddings, rope_scaling,
                     rope_theta, dtype)
    (out / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    generation = {"bos_token_id": BOS_TOKEN_ID, "eos_token_id": EOS_TOKEN_ID,
                  "do_sample": False}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2), encoding="utf-8")
    tensors = random_weights(config, seed)
    tensors = {name: t.to(_DTYPES[dtype]).contiguous() for name, t in tensors.items()}
    _save(out, tensors, num_shards)
    if with_tokenizer:
        # Imported here: the tokenizer module lives with the processing engineer's code and is
        # not needed to build weights alone.
        from engine_core.processing.tiny_tokenizer import write_tiny_tokenizer

        write_tiny_tokenizer(out, vocab_size, seed=seed)
    return out


def random_weights(config: dict[str, Any], seed: int) -> dict[str, torch.Tensor]:
    """HF-named float32 tensors: linears ~ N(0, 1/fan_in) so activations keep their scale and the
    logits are far from uniform; norms 1 + small noise so a missing norm weight is visible."""
    gen = torch.Generator().manual_seed(seed)
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    head_dim = config["head_dim"]
    q_size = config["num_attention_heads"] * head_dim
    kv_size = config["num_key_value_heads"] * head_dim
    qkv_bias = config["model_type"] == "qwen2"

    def linear(out_features: int, in_features: int) -> torch.Tensor:
        return torch.randn(out_features, in_features, generator=gen) / math.sqrt(in_features)

    def norm() -> torch.Tensor:
        return 1.0 + 0.1 * torch.randn(hidden, generator=gen)

    tensors = {"model.embed_tokens.weight":
               0.5 * torch.randn(config["vocab_size"], hidden, generator=gen)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for name, size in (("q", q_size), ("k", kv_size), ("v", kv_size)):
            tensors[f"{p}self_attn.{name}_proj.weight"] = linear(size, hidden)
            if qkv_bias:
                tensors[f"{p}self_attn.{name}_proj.bias"] = 0.1 * torch.randn(size, generator=gen)
        tensors[f"{p}self_attn.o_proj.weight"] = linear(hidden, q_size)
        tensors[f"{p}mlp.gate_proj.weight"] = linear(inter, hidden)
        tensors[f"{p}mlp.up_proj.weight"] = linear(inter, hidden)
        tensors[f"{p}mlp.down_proj.weight"] = linear(hidden, inter)
        tensors[f"{p}input_layernorm.weight"] = norm()
        tensors[f"{p}post_attention_layernorm.weight"] = norm()
    tensors["model.norm.weight"] = norm()
    if not config["tie_word_embeddings"]:
        tensors["lm_head.weight"] = linear(config["vocab_size"], hidden)
    return tensors


def _config(arch: str, num_layers: int, hidden: int, num_heads: int, num_kv_heads: int,
            vocab_size: int, intermediate: int, max_positions: int, tie: bool,
            rope_scaling: dict[str, Any] | None, rope_theta: float, dtype: str) -> dict[str, Any]:
    architecture, model_type = ARCHITECTURES[arch]
    config: dict[str, Any] = {
        "architectures": [architecture],
        "model_type": model_type,
        "vocab_size": vocab_size,
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads,
        "head_dim": hidden // num_heads,
        "hidden_act": "silu",
        "max_position_embeddings": max_positions,
        "rms_norm_eps": 1e-6,
        "rope_theta": rope_theta,
        "rope_scaling": rope_scaling,
        "tie_word_embeddings": tie,
        "bos_token_id": BOS_TOKEN_ID,
        "eos_token_id": EOS_TOKEN_ID,
        "torch_dtype": dtype,
        "initializer_range": 0.02,
        "use_cache": True,
        "attention_dropout": 0.0,
    }
    if arch == "llama":
        config.update(attention_bias=False, mlp_bias=False)
    else:
        # Full attention everywhere: the engine implements no sliding window.
        config.update(sliding_window=None)
        if arch == "qwen2":
            config.update(use_sliding_window=False, max_window_layers=num_layers)
    return config


def _save(out: Path, tensors: dict[str, torch.Tensor], num_shards: int) -> None:
    for stale in [*out.glob("model*.safetensors"), out / "model.safetensors.index.json"]:
        stale.unlink(missing_ok=True)
    if num_shards == 1:
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
        return
    names = list(tensors)
    per_shard = math.ceil(len(names) / num_shards)
    weight_map: dict[str, str] = {}
    for shard in range(num_shards):
        fname = f"model-{shard + 1:05d}-of-{num_shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[shard * per_shard:(shard + 1) * per_shard]}
        save_file(part, str(out / fname), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, fname))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2), encoding="utf-8")


def _validate(arch: str, num_layers: int, hidden: int, num_heads: int, num_kv_heads: int,
              vocab_size: int, dtype: str, num_shards: int) -> None:
    if arch not in ARCHITECTURES:
        raise ValueError(f"arch must be one of {', '.join(ARCHITECTURES)}, got {arch!r}")
    for name, value in (("num_layers", num_layers), ("hidden_size", hidden),
                        ("num_heads", num_heads), ("num_kv_heads", num_kv_heads),
                        ("vocab_size", vocab_size), ("num_shards", num_shards)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be >= 1, got {value!r}")
    if hidden % num_heads != 0 or (hidden // num_heads) % 2 != 0:
        raise ValueError(
            f"hidden_size must be a multiple of num_heads ({num_heads}) with an even head_dim, "
            f"got {hidden}")
    if num_heads % num_kv_heads != 0:
        raise ValueError(
            f"num_kv_heads must divide num_heads ({num_heads}), got {num_kv_heads}")
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(_DTYPES)}, got {dtype!r}")
