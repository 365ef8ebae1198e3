"""GGUF files: a tiny Llama written with gguf's own writer (llama.cpp's layout: permuted q/k,
quantized tensors, a byte-level BPE vocabulary) loads back as the model it was made from."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")

from engine_core import EngineArgs, LLMEngine, SamplingParams  # noqa: E402
from engine_core.default_model import resolve_model_dir  # noqa: E402
from engine_core.model_executor.gguf import gguf_to_hf_dir  # noqa: E402
from engine_core.model_executor.gguf.config import hf_config  # noqa: E402
from engine_core.model_executor.gguf.tensors import hf_name, unpermute  # noqa: E402
from tests.conftest import build_tiny_model  # noqa: E402
from tests.model_executor.gguf_writer import llama_cpp_permute, write_gguf  # noqa: E402


def test_unpermute_inverts_llama_cpps_permutation() -> None:
    w = np.arange(8 * 16 * 3, dtype=np.float32).reshape(8 * 16, 3)
    assert np.array_equal(unpermute(llama_cpp_permute(w, 8), 8), w)
    assert not np.array_equal(llama_cpp_permute(w, 8), w)


def test_tensor_names_map_to_hf_and_rope_tables_are_dropped() -> None:
    assert hf_name("blk.3.attn_q.weight") == "model.layers.3.self_attn.q_proj.weight"
    assert hf_name("blk.0.ffn_norm.weight") == "model.layers.0.post_attention_layernorm.weight"
    assert hf_name("output.weight") == "lm_head.weight"
    assert hf_name("rope_freqs.weight") is None


def test_metadata_errors_name_the_key() -> None:
    with pytest.raises(ValueError, match="'general.architecture' 'falcon' is not supported"
                                         "|general.architecture 'falcon' is not supported"):
        hf_config({"general.architecture": "falcon"}, set(), 10)
    with pytest.raises(ValueError, match="no 'llama.embedding_length'"):
        hf_config({"general.architecture": "llama"}, set(), 10)


@pytest.mark.parametrize("quantized", ["F32", "Q8_0"])
def test_a_gguf_file_loads_as_the_model_it_was_made_from(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, quantized: str) -> None:
    monkeypatch.setenv("STRAND_CACHE_DIR", str(tmp_path / "cache"))
    model_dir = build_tiny_model(tmp_path / "tiny", hidden_size=64, num_heads=4, num_kv_heads=2)
    path = tmp_path / f"tiny-{quantized}.gguf"
    write_gguf(model_dir, path, quantized)
    converted = gguf_to_hf_dir(path)
    assert resolve_model_dir(str(path)) == str(converted)  # cached: the same directory
    from safetensors.torch import load_file

    want, got = (load_file(str(d / "model.safetensors")) for d in (model_dir, converted))
    tol = 0 if quantized == "F32" else 2e-2  # Q8_0: one int8 step of each 32-block's range
    for name, t in want.items():
        torch.testing.assert_close(got[name], t.float(), atol=tol * float(t.abs().max()), rtol=0)
    prompts = [[5, 9, 13, 200, 7], [100, 101, 102]]
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)

    def greedy(model: str) -> list[list[int]]:
        engine = LLMEngine.from_engine_args(EngineArgs(model=model, dtype="float32"))
        for i, p in enumerate(prompts):
            engine.add_request(str(i), {"prompt_token_ids": p}, params)
        done: dict[str, list[int]] = {}
        while engine.has_unfinished_requests():
            for o in engine.step():
                if o.finished:
                    done[o.request_id] = list(o.outputs[0].token_ids)
        return [done[str(i)] for i in range(len(prompts))]

    if quantized == "F32":
        assert greedy(str(path)) == greedy(str(model_dir))
    tokenizer_text = "hello world, 123"
    from engine_core.processing.tokenizer import Tokenizer

    # The BPE itself; BOS is not added for GGUF vocabularies (transformers' GGUF tokenizer,
    # the oracle, adds none).
    assert (Tokenizer.from_dir(converted).encode(tokenizer_text, add_special_tokens=False)
            == Tokenizer.from_dir(model_dir).encode(tokenizer_text, add_special_tokens=False))


def test_a_converted_directory_names_the_file_it_was_made_from(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # `strand serve` hands its stages the converted directory; quantization='gguf' then finds the
    # file's blocks from it, while the file is there unchanged.
    from engine_core.default_model import gguf_file

    monkeypatch.setenv("STRAND_CACHE_DIR", str(tmp_path / "cache"))
    model_dir = build_tiny_model(tmp_path / "tiny", hidden_size=64, num_heads=4, num_kv_heads=2)
    path = tmp_path / "tiny-Q8_0.gguf"
    write_gguf(model_dir, path, "Q8_0")
    converted = gguf_to_hf_dir(path)
    assert gguf_file(str(converted)) == str(path.resolve())
    assert gguf_file(str(model_dir)) is None  # a directory made from no GGUF file
    engine = LLMEngine.from_engine_args(EngineArgs(model=str(converted), quantization="gguf"))
    assert engine.engine_core.runner.model.lm_head.qtype == 8
    path.write_bytes(path.read_bytes() + b"\0")  # the file changed since: not its source now
    assert gguf_file(str(converted)) is None


def test_conversion_streams_tensors_in_pieces_of_rows(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A few rows dequantized at a time (the piece here 1024 weights: 16 rows of 64), the file
    # the same as the whole tensors dequantized at once.
    from safetensors.torch import load_file

    from engine_core.model_executor.gguf import tensors as gguf_tensors

    model_dir = build_tiny_model(tmp_path / "tiny", hidden_size=64, num_heads=4, num_kv_heads=2)
    path = tmp_path / "tiny-Q4_1.gguf"
    write_gguf(model_dir, path, "Q4_1")
    monkeypatch.setenv("STRAND_CACHE_DIR", str(tmp_path / "whole"))
    whole = load_file(str(gguf_to_hf_dir(path) / "model.safetensors"))
    monkeypatch.setattr(gguf_tensors, "PIECE_WEIGHTS", 1024)
    monkeypatch.setenv("STRAND_CACHE_DIR", str(tmp_path / "pieces"))
    pieces = load_file(str(gguf_to_hf_dir(path) / "model.safetensors"))
    assert whole.keys() == pieces.keys()
    for name, t in whole.items():
        assert torch.equal(pieces[name], t), name


def test_a_streamed_tensor_must_be_the_one_announced(tmp_path: Path) -> None:
    from engine_core.model_executor.gguf.safetensors_stream import write_streamed

    rows = np.zeros((4, 8), dtype=np.float32)
    with pytest.raises(ValueError, match="b is not the one the header announced"):
        write_streamed(tmp_path / "x.safetensors", [("a", (4, 8))], [("b", iter([rows]))])
    with pytest.raises(ValueError, match="a got 16 values, its shape"):
        write_streamed(tmp_path / "x.safetensors", [("a", (4, 8))], [("a", iter([rows[:2]]))])
    with pytest.raises(ValueError, match="was announced but never written"):
        write_streamed(tmp_path / "x.safetensors", [("a", (4, 8)), ("c", (1,))],
                       [("a", iter([rows]))])
