"""A GGUF file's metadata as an HF config.json dict."""

from __future__ import annotations

from typing import Any

import numpy as np

from strand.engine_core.model_executor.gguf.rope_freqs import rope_scaling_of

# GGUF general.architecture -> the HF class the engine runs it as.
ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                 "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}


def field(metadata: dict[str, Any], key: str, default: Any = None, required: bool = False) -> Any:
    if key in metadata:
        return metadata[key]
    if required:
        raise ValueError(f"GGUF metadata has no {key!r}")
    return default


def hf_config(metadata: dict[str, Any], tensor_names: set[str], vocab_size: int,
              rope_freqs: np.ndarray | None = None) -> dict[str, Any]:
    """rope_freqs: the file's rope_freqs tensor (llama3 rope scaling: gguf/rope_freqs.py)."""
    arch = field(metadata, "general.architecture", required=True)
    if arch not in ARCHITECTURES:
        raise ValueError(f"GGUF general.architecture {arch!r} is not supported; supported: "
                         f"{', '.join(sorted(ARCHITECTURES))}")
    p = f"{arch}."
    hidden = int(field(metadata, p + "embedding_length", required=True))
    heads = int(field(metadata, p + "attention.head_count", required=True))
    config: dict[str, Any] = {
        "architectures": [ARCHITECTURES[arch]],
        "model_type": arch,
        "hidden_size": hidden,
        "num_hidden_layers": int(field(metadata, p + "block_count", required=True)),
        "intermediate_size": int(field(metadata, p + "feed_forward_length", required=True)),
        "num_attention_heads": heads,
        "num_key_value_heads": int(field(metadata, p + "attention.head_count_kv", heads)),
        "rms_norm_eps": float(field(metadata, p + "attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(field(metadata, p + "rope.freq_base", 10000.0)),
        "max_position_embeddings": int(field(metadata, p + "context_length", 2048)),
        "vocab_size": int(field(metadata, p + "vocab_size", vocab_size)),
        # No output.weight: the LM head reads the embedding table (llama.cpp drops the copy).
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "torch_dtype": "float32",
        "bos_token_id": field(metadata, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": field(metadata, "tokenizer.ggml.eos_token_id"),
    }
    key_length = field(metadata, p + "attention.key_length")
    if key_length is not None and int(key_length) != hidden // heads:
        config["head_dim"] = int(key_length)
    scaling = field(metadata, p + "rope.scaling.type")
    if scaling == "linear":
        config["rope_scaling"] = {"rope_type": "linear",
                                  "factor": float(field(metadata, p + "rope.scaling.factor", 1.0))}
    elif scaling not in (None, "none"):
        raise ValueError(f"GGUF {p}rope.scaling.type {scaling!r} is not supported (linear is)")
    elif rope_freqs is not None:
        found = rope_scaling_of(rope_freqs, config["rope_theta"],
                                int(config.get("head_dim", hidden // heads)))
        if found is not None:
            config["rope_scaling"] = found
    if arch == "qwen2":
        config["use_sliding_window"] = False
    return config
