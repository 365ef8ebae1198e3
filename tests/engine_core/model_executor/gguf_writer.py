"""A GGUF file written with gguf's own GGUFWriter from a tiny HF checkpoint (the tests' stand-in for
a file llama.cpp's converter made)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file


def llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """What llama.cpp's convert_hf_to_gguf.py does to Llama's q and k rows."""
    return (w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def llama3_rope_factors(config: dict[str, Any]) -> np.ndarray:
    """The rope_freqs tensor llama.cpp's convert_hf_to_gguf.py writes for llama3 rope scaling:
    each frequency's divisor (its formula, written out here on its own)."""
    scaling = config["rope_scaling"]
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    base = config.get("rope_theta", 10000.0)
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old = scaling["original_max_position_embeddings"]
    factors = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * math.pi * base ** (i / head_dim)
        if wavelen < old / high:
            factors.append(1.0)
        elif wavelen > old / low:
            factors.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


def write_gguf(model_dir: Path, out: Path, quantized: str,
               types: dict[str, str] | None = None) -> None:
    """The HF checkpoint in model_dir as a GGUF file the way llama.cpp writes one: q/k rows
    permuted, 2-D tensors in `quantized` (a GGMLQuantizationType name), or in `types[gguf
    name]` where given, vectors in F32, a byte-level BPE vocabulary. The K-quants (which the
    `gguf` package does not make) are made by tests/engine_core/model_executor/kquants.py."""
    import gguf

    from tests.engine_core.model_executor.kquants import QUANTIZERS

    config = json.loads((model_dir / "config.json").read_text())
    tok = json.loads((model_dir / "tokenizer.json").read_text())
    arch = config.get("model_type", "llama")  # llama, or qwen2 (q/k/v biases, no permutation)
    w = gguf.GGUFWriter(str(out), arch)
    w.add_block_count(config["num_hidden_layers"])
    w.add_context_length(config["max_position_embeddings"])
    w.add_embedding_length(config["hidden_size"])
    w.add_feed_forward_length(config["intermediate_size"])
    w.add_head_count(config["num_attention_heads"])
    w.add_head_count_kv(config["num_key_value_heads"])
    w.add_layer_norm_rms_eps(config["rms_norm_eps"])
    w.add_rope_freq_base(config.get("rope_theta", 10000.0))
    vocab = sorted(tok["model"]["vocab"].items(), key=lambda kv: kv[1])
    w.add_tokenizer_model("gpt2")
    w.add_token_list([t for t, _ in vocab])
    w.add_token_types([1] * len(vocab))
    merges = tok["model"]["merges"]
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    w.add_eos_token_id(config.get("eos_token_id") or 0)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight":
             "output_norm.weight", "lm_head.weight": "output.weight"}
    layer = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
             "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
    for name, t in load_file(str(model_dir / "model.safetensors")).items():
        a = t.float().numpy()
        if name.startswith("model.layers."):
            i, rest = name[len("model.layers."):].split(".", 1)
            module, kind = rest.rsplit(".", 1)
            if arch != "llama":
                pass
            elif module == "self_attn.q_proj":
                a = llama_cpp_permute(a, config["num_attention_heads"])
            elif module == "self_attn.k_proj":
                a = llama_cpp_permute(a, config["num_key_value_heads"])
            gname = f"blk.{i}.{layer[module]}.{kind}"
        else:
            gname = names[name]
        type_name = (types or {}).get(gname, quantized)
        qtype = getattr(gguf.GGMLQuantizationType, type_name)
        if a.ndim == 2 and type_name in QUANTIZERS:
            w.add_tensor(gname, QUANTIZERS[type_name](a), raw_dtype=qtype)
        elif a.ndim == 2 and qtype != gguf.GGMLQuantizationType.F32:
            w.add_tensor(gname, gguf.quants.quantize(a, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(gname, a)
    scaling = config.get("rope_scaling") or {}
    if scaling.get("rope_type") == "llama3":  # as llama.cpp's converter: the divisors alone
        w.add_tensor("rope_freqs.weight", llama3_rope_factors(config))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def requantize_gguf(src: Path, out: Path, types: dict[str, str]) -> None:
    """A copy of the GGUF file src (its metadata and tensors as they are) with the tensors named
    in `types` dequantized and written again in the type given (a GGMLQuantizationType name):
    a real model's file in the mix of types a llama.cpp quantization makes."""
    import gguf

    from benchmarks.quantized import gguf_copy_writer
    from tests.engine_core.model_executor.kquants import QUANTIZERS

    reader = gguf.GGUFReader(str(src))
    w = gguf_copy_writer(reader, out)
    for t in reader.tensors:
        shape = [int(n) for n in reversed(t.shape)]  # GGUF lists [in, out]; numpy rows first
        if t.name not in types:
            w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)  # [rows, bytes]
            continue
        a = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type)).reshape(shape)
        name = types[t.name]
        qtype = getattr(gguf.GGMLQuantizationType, name)
        blocks = QUANTIZERS[name](a) if name in QUANTIZERS else gguf.quants.quantize(a, qtype)
        w.add_tensor(t.name, blocks, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def gguf_weights(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor the engine reads from a GGUF file, under its HF name and dequantized, as the
    loader reads them (through the converted directory's config)."""
    from strand.engine_core.model_executor.gguf import gguf_to_hf_dir
    from strand.engine_core.model_executor.gguf.weights import GGUFWeights

    config = json.loads((gguf_to_hf_dir(path) / "config.json").read_text())
    with GGUFWeights(path, config) as f:
        return {name: f.get_tensor(name) for name in f.keys()}
