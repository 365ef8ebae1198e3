"""Every GGUF tensor type the issue names loads as gguf's own dequantization of it: F16 and BF16
(from real weights), Q4_K, Q5_K and Q6_K (random super-blocks: gguf-py cannot quantize to them),
q/k rows un-permuted as for float files. F32 and Q8_0 are covered in test_gguf.py, and Q8_0,
Q4_0, Q4_1 packed in test_gguf_quantized.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from strand.engine_core.model_executor.gguf.tensors import unpermute  # noqa: E402
from tests.conftest import build_tiny_model  # noqa: E402
from tests.engine_core.model_executor.gguf_writer import gguf_weights, llama_cpp_permute  # noqa: E402

HEADS, KV_HEADS = 4, 2
# Byte offsets of each K-quant super-block's float16 scales: (d, dmin) for Q4_K and Q5_K, d at the
# end for Q6_K. Random bytes there would be NaN or huge; the rest of a block is any bytes.
_SCALES = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}
_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight":
          "output_norm.weight", "lm_head.weight": "output.weight"}
_LAYER = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
          "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
          "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
          "post_attention_layernorm": "ffn_norm"}


def _gguf_name(name: str) -> str:
    if name in _NAMES:
        return _NAMES[name]
    i, rest = name[len("model.layers."):].split(".", 1)
    module, kind = rest.rsplit(".", 1)
    return f"blk.{i}.{_LAYER[module]}.{kind}"


def _raw(a: np.ndarray, kind: str, rng: np.random.Generator) -> np.ndarray:
    """A 2-D float tensor as the raw data of a GGUF tensor of `kind`."""
    qtype = getattr(gguf.GGMLQuantizationType, kind)
    if kind in ("F16", "BF16"):
        return gguf.quants.quantize(a, qtype)
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, (a.shape[0], a.shape[1] // block, size), dtype=np.uint8)
    for offset in _SCALES[kind]:
        scale = rng.uniform(1e-3, 2e-2, blocks.shape[:2]).astype(np.float16)
        blocks[..., offset:offset + 2] = scale[..., None].view(np.uint8)
    return blocks.reshape(a.shape[0], -1)


@pytest.mark.parametrize("kind", ["F16", "BF16", "Q4_K", "Q5_K", "Q6_K"])
def test_tensor_type_dequantizes_as_gguf_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              kind: str) -> None:
    from safetensors.torch import load_file

    monkeypatch.setenv("STRAND_CACHE_DIR", str(tmp_path / "cache"))
    # K-quant super-blocks hold 256 weights: every row here is 256 long.
    model_dir = build_tiny_model(tmp_path / "tiny", num_layers=1, hidden_size=256,
                                 num_heads=HEADS, num_kv_heads=KV_HEADS, intermediate_size=256)
    config = json.loads((model_dir / "config.json").read_text())
    tok = json.loads((model_dir / "tokenizer.json").read_text())
    path = tmp_path / f"tiny-{kind}.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_context_length(config["max_position_embeddings"])
    w.add_embedding_length(256)
    w.add_feed_forward_length(256)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_layer_norm_rms_eps(config["rms_norm_eps"])
    w.add_tokenizer_model("gpt2")
    w.add_token_list([t for t, _ in sorted(tok["model"]["vocab"].items(), key=lambda kv: kv[1])])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m)
                        for m in tok["model"]["merges"]])
    rng = np.random.default_rng(0)
    qtype = getattr(gguf.GGMLQuantizationType, kind)
    raws: dict[str, np.ndarray] = {}
    for name, t in load_file(str(model_dir / "model.safetensors")).items():
        a = t.float().numpy()
        if name.endswith("q_proj.weight"):
            a = llama_cpp_permute(a, HEADS)
        elif name.endswith("k_proj.weight"):
            a = llama_cpp_permute(a, KV_HEADS)
        if a.ndim == 2:
            raws[name] = _raw(a, kind, rng)
            w.add_tensor(_gguf_name(name), raws[name], raw_dtype=qtype)
        else:
            w.add_tensor(_gguf_name(name), a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    reader_types = {t.name: t.tensor_type for t in gguf.GGUFReader(str(path)).tensors}
    assert reader_types["blk.0.attn_q.weight"] == qtype
    got = gguf_weights(path)
    assert set(raws) <= set(got)
    for name, raw in raws.items():
        want = np.asarray(gguf.quants.dequantize(raw, qtype), dtype=np.float32)
        if name.endswith("q_proj.weight"):
            want = unpermute(want, HEADS)
        elif name.endswith("k_proj.weight"):
            want = unpermute(want, KV_HEADS)
        assert np.isfinite(want).all() and want.std() > 0
        assert np.array_equal(got[name].numpy(), want), name


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K"])
def test_rows_the_cpu_kernels_dequantize_are_ggufs_bit_for_bit(kind: str) -> None:
    # The types the C++ kernels read as the file has them are dequantized by them at load
    # (where they are built): the same floats as gguf's own dequantization.
    from strand.engine_core.model_executor.gguf import tensors
    from strand.engine_core.model_executor.gguf.tensor_table import GGUFTensor
    from strand.kernels._cpu_build import KERNELS

    qtype = getattr(gguf.GGMLQuantizationType, kind)
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(int(qtype))
    rows, width = 40, 512
    blocks = rng.integers(0, 256, (rows, width // block, size), dtype=np.uint8)
    halves = (0, 2) if kind in ("Q4_1", "Q5_1", "Q4_K") else (0,)  # d (and m or dmin)
    for offset in halves:
        scale = rng.uniform(-2e-2, 2e-2, blocks.shape[:2]).astype(np.float16)
        blocks[..., offset:offset + 2] = scale[..., None].view(np.uint8)
    data = blocks.reshape(rows, -1)
    t = GGUFTensor("blk.0.ffn_up.weight", qtype, np.array([width, rows], dtype=np.uint64), data)
    want = np.asarray(gguf.quants.dequantize(data, qtype), dtype=np.float32)
    assert np.isfinite(want).all() and want.std() > 0
    assert np.array_equal(tensors.dequantized_rows(t, 0, rows), want)
    assert np.array_equal(tensors.dequantized_rows(t, 7, 29), want[7:29])
    if KERNELS.module() is not None:  # built: the load takes the kernel's path
        assert tensors._kernel_dequantize(int(qtype)) is not None
