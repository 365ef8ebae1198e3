"""make_tiny_model: a complete, seeded, random HF-format model directory, made without transformers.

config.json, model.safetensors (HF tensor names), generation_config.json and (optionally) a BPE
tokenizer trained on generated text. Tests, the demo and the benchmarks all build their models here.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

ARCHITECTURES = {"llama": ("LlamaForCausalLM", "llama"),
                 "mistral": ("MistralForCausalLM", "mistral"),
                 "qwen2": ("Qwen2ForCausalLM", "qwen2"),
                 "qwen3": ("Qwen3ForCausalLM", "qwen3"),
                 "qwen3_moe": ("Qwen3MoeForCausalLM", "qwen3_moe"),
                 "phi3": ("Phi3ForCausalLM", "phi3"),
                 "gemma2": ("Gemma2ForCausalLM", "gemma2"),
                 "gemma3": ("Gemma3ForCausalLM", "gemma3_text")}
_GEMMA = ("gemma2", "gemma3")
GEMMA_DEFAULT_WINDOW = 64  # tokens; tiny Gemma layers alternate sliding and full attention
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
    sliding_window: int | None = None,
    extra_config: dict[str, Any] | None = None,
    dtype: str = "float32",
    num_shards: int = 1,
    seed: int = 0,
    with_tokenizer: bool = True,
    labels: Sequence[str] = (),
) -> Path:
    """Write the directory and return its path. ValueError naming the bad argument.

    sliding_window: Mistral and Phi-3 apply it on every layer, Gemma on its sliding layers
    (GEMMA_DEFAULT_WINDOW when None); extra_config: config.json fields set last (tests' knobs:
    softcaps, mlp_only_layers, ...); labels: a *ForSequenceClassification checkpoint of the same
    family, its `score` layer (one row per label) in place of the LM head."""
    _validate(arch, num_layers, hidden_size, num_heads, num_kv_heads, vocab_size, dtype, num_shards)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    intermediate = intermediate_size or 2 * hidden_size
    config = _config(arch, num_layers, hidden_size, num_heads, num_kv_heads, vocab_size,
                     intermediate, max_position_embeddings, tie_word_embeddings, rope_scaling,
                     rope_theta, dtype, sliding_window)
    config.update(extra_config or {})
    if labels:
        config["architectures"] = [config["architectures"][0].replace(
            "ForCausalLM", "ForSequenceClassification")]
        config["id2label"] = {str(i): label for i, label in enumerate(labels)}
        config["label2id"] = {label: i for i, label in enumerate(labels)}
    (out / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    generation = {"bos_token_id": BOS_TOKEN_ID, "eos_token_id": EOS_TOKEN_ID,
                  "do_sample": False}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2), encoding="utf-8")
    tensors = random_weights(config, seed)
    if labels:
        tensors.pop("lm_head.weight", None)
        gen = torch.Generator().manual_seed(seed + 1)
        tensors["score.weight"] = torch.randn(len(labels), hidden_size,
                                              generator=gen) / math.sqrt(hidden_size)
    tensors = {name: t.to(_DTYPES[dtype]).contiguous() for name, t in tensors.items()}
    _save(out, tensors, num_shards)
    if with_tokenizer:
        # Imported here: the tokenizer module lives with the processing engineer's code and is
        # not needed to build weights alone.
        from strand.testing.tiny_tokenizer import write_tiny_tokenizer

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
    model_type = config["model_type"]
    qkv_bias = model_type == "qwen2"
    gemma = model_type.startswith("gemma")

    def linear(out_features: int, in_features: int) -> torch.Tensor:
        return torch.randn(out_features, in_features, generator=gen) / math.sqrt(in_features)

    def norm(size: int = hidden) -> torch.Tensor:
        # Gemma stores w of its (1 + w) scale.
        return (0.0 if gemma else 1.0) + 0.1 * torch.randn(size, generator=gen)

    tensors = {"model.embed_tokens.weight":
               0.5 * torch.randn(config["vocab_size"], hidden, generator=gen)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for name, size in (("q", q_size), ("k", kv_size), ("v", kv_size)):
            tensors[f"{p}self_attn.{name}_proj.weight"] = linear(size, hidden)
            if qkv_bias:
                tensors[f"{p}self_attn.{name}_proj.bias"] = 0.1 * torch.randn(size, generator=gen)
        tensors[f"{p}self_attn.o_proj.weight"] = linear(hidden, q_size)
        if model_type in ("qwen3", "qwen3_moe", "gemma3_text"):
            tensors[f"{p}self_attn.q_norm.weight"] = norm(head_dim)
            tensors[f"{p}self_attn.k_norm.weight"] = norm(head_dim)
        if (model_type == "qwen3_moe" and i not in config["mlp_only_layers"]
                and (i + 1) % config["decoder_sparse_step"] == 0):
            tensors.update(_moe_weights(config, p, linear))
        else:
            tensors[f"{p}mlp.gate_proj.weight"] = linear(inter, hidden)
            tensors[f"{p}mlp.up_proj.weight"] = linear(inter, hidden)
            tensors[f"{p}mlp.down_proj.weight"] = linear(hidden, inter)
        tensors[f"{p}input_layernorm.weight"] = norm()
        tensors[f"{p}post_attention_layernorm.weight"] = norm()
        if gemma:
            tensors[f"{p}pre_feedforward_layernorm.weight"] = norm()
            tensors[f"{p}post_feedforward_layernorm.weight"] = norm()
        if model_type == "phi3":  # Phi-3 checkpoints store both fused
            tensors[f"{p}self_attn.qkv_proj.weight"] = torch.cat(
                [tensors.pop(f"{p}self_attn.{n}_proj.weight") for n in ("q", "k", "v")])
            tensors[f"{p}mlp.gate_up_proj.weight"] = torch.cat(
                [tensors.pop(f"{p}mlp.{n}_proj.weight") for n in ("gate", "up")])
    tensors["model.norm.weight"] = norm()
    if not config["tie_word_embeddings"]:
        tensors["lm_head.weight"] = linear(config["vocab_size"], hidden)
    return tensors


def _moe_weights(config: dict[str, Any], p: str,
                 linear: Any) -> dict[str, torch.Tensor]:
    """Router and per-expert tensors under HF's (pre-transformers-5) names, as on the Hub."""
    hidden, inter = config["hidden_size"], config["moe_intermediate_size"]
    # A router of a larger scale than a linear's: the top-k choice should vary between tokens.
    tensors = {f"{p}mlp.gate.weight": 4.0 * linear(config["num_experts"], hidden)}
    for e in range(config["num_experts"]):
        tensors[f"{p}mlp.experts.{e}.gate_proj.weight"] = linear(inter, hidden)
        tensors[f"{p}mlp.experts.{e}.up_proj.weight"] = linear(inter, hidden)
        tensors[f"{p}mlp.experts.{e}.down_proj.weight"] = linear(hidden, inter)
    return tensors


def _config(arch: str, num_layers: int, hidden: int, num_heads: int, num_kv_heads: int,
            vocab_size: int, intermediate: int, max_positions: int, tie: bool,
            rope_scaling: dict[str, Any] | None, rope_theta: float, dtype: str,
            sliding_window: int | None) -> dict[str, Any]:
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
    elif arch in ("mistral", "phi3"):
        config.update(sliding_window=sliding_window)
        if arch == "phi3":
            # pad_token_id: Phi3Config's default (32000) is past the tiny vocabulary.
            config.update(pad_token_id=0, original_max_position_embeddings=max_positions,
                          resid_pdrop=0.0, embd_pdrop=0.0)
    elif arch in ("qwen2", "qwen3", "qwen3_moe"):
        config.update(sliding_window=None, use_sliding_window=False,
                      max_window_layers=num_layers)
        if arch != "qwen2":
            config.update(attention_bias=False)
        if arch == "qwen3_moe":
            config.update(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=hidden,
                          norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
                          output_router_logits=False, router_aux_loss_coef=0.0)
    else:  # Gemma: sliding layers first, then alternating with global ones
        config.update(
            hidden_activation="gelu_pytorch_tanh", hidden_act="gelu_pytorch_tanh",
            pad_token_id=0, attention_bias=False, query_pre_attn_scalar=hidden // num_heads,
            sliding_window=sliding_window or GEMMA_DEFAULT_WINDOW,
            layer_types=["sliding_attention" if (i + 1) % 2 else "full_attention"
                         for i in range(num_layers)])
        if arch == "gemma2":
            config.update(attn_logit_softcapping=50.0, final_logit_softcapping=30.0)
        else:
            config.update(rope_local_base_freq=10000.0, attn_logit_softcapping=None,
                          final_logit_softcapping=None)
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
