"""GGUF files: a tiny Llama written with gguf's own writer (llama.cpp's layout: permuted q/k,
quantized tensors, a byte-level BPE vocabulary) loads back as the model it was made from."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")

from strand.engine_core import EngineArgs, LLMEngine, SamplingParams  # noqa: E402
from strand.engine_core.default_model import resolve_model_dir  # noqa: E402
from strand.engine_core.model_executor.gguf import gguf_to_hf_dir  # noqa: E402
from strand.engine_core.model_executor.gguf.config import hf_config  # noqa: E402
from strand.engine_core.model_executor.gguf.tensors import hf_name, unpermute  # noqa: E402
from strand.engine_core.model_executor.gguf.weights import GGUFWeights  # noqa: E402
from strand.engine_core.outputs import RequestOutput  # noqa: E402
from tests.conftest import build_tiny_model  # noqa: E402
from tests.engine_core.model_executor.gguf_writer import gguf_weights, llama_cpp_permute, write_gguf  # noqa: E402


def _tiny_gguf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str) -> tuple[Path, Path]:
    """A tiny Llama and its GGUF file in `kind`; converted directories under tmp_path."""
    monkeypatch.setenv("STRAND_CACHE_DIR", str(tmp_path / "cache"))
    model_dir = build_tiny_model(tmp_path / "tiny", hidden_size=64, num_heads=4, num_kv_heads=2)
    path = tmp_path / f"tiny-{kind}.gguf"
    write_gguf(model_dir, path, kind)
    return model_dir, path


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
    model_dir, path = _tiny_gguf(tmp_path, monkeypatch, quantized)
    converted = gguf_to_hf_dir(path)
    assert resolve_model_dir(str(path)) == str(converted)  # cached: the same directory
    assert not list(converted.glob("*.safetensors"))  # the weights stay in the file
    from safetensors.torch import load_file

    want, got = load_file(str(model_dir / "model.safetensors")), gguf_weights(path)
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
                assert isinstance(o, RequestOutput)  # a generating engine's
                if o.finished:
                    done[o.request_id] = list(o.outputs[0].token_ids)
        return [done[str(i)] for i in range(len(prompts))]

    if quantized == "F32":
        assert greedy(str(path)) == greedy(str(model_dir))
    tokenizer_text = "hello world, 123"
    from strand.engine_core.processing.tokenizer import Tokenizer

    # The BPE itself; BOS is not added for GGUF vocabularies (transformers' GGUF tokenizer,
    # the oracle, adds none).
    assert (Tokenizer.from_dir(converted).encode(tokenizer_text, add_special_tokens=False)
            == Tokenizer.from_dir(model_dir).encode(tokenizer_text, add_special_tokens=False))


@pytest.mark.parametrize("original", [256, 8192])
def test_llama3_rope_scaling_comes_back_from_the_rope_freqs_tensor(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, original: int) -> None:
    """llama.cpp's converter keeps llama3 rope scaling only as rope_freqs: the file runs with the
    scaling its HF checkpoint has, not plain rope."""
    from strand.engine_core.model_executor.layers.rotary_embedding import rope_inv_freq
    from strand.testing.tiny_model import LLAMA3_ROPE_SCALING

    monkeypatch.setenv("STRAND_CACHE_DIR", str(tmp_path / "cache"))
    scaling = {**LLAMA3_ROPE_SCALING, "original_max_position_embeddings": original}
    model_dir = build_tiny_model(tmp_path / "tiny", hidden_size=64, num_heads=4, num_kv_heads=2,
                                 rope_scaling=scaling, rope_theta=500000.0)
    path = tmp_path / "tiny-llama3.gguf"
    write_gguf(model_dir, path, "F32")
    config = json.loads((gguf_to_hf_dir(path) / "config.json").read_text())
    found = config["rope_scaling"]
    assert found["rope_type"] == "llama3" and found["factor"] == scaling["factor"]
    torch.testing.assert_close(rope_inv_freq(16, 500000.0, found),
                               rope_inv_freq(16, 500000.0, scaling), rtol=1e-5, atol=0)

    def rope_table(model: str) -> torch.Tensor:
        engine = LLMEngine.from_engine_args(EngineArgs(model=model, dtype="float32"))
        return engine.engine_core.runner.model.model.rotary.cos_sin

    # The engine's rope table from the file is the checkpoint's (short greedy runs of a tiny
    # model do not tell the scaling apart), and not plain rope's.
    table = rope_table(str(path))
    torch.testing.assert_close(table, rope_table(str(model_dir)), rtol=0, atol=1e-5)
    plain = build_tiny_model(tmp_path / "plain", hidden_size=64, num_heads=4, num_kv_heads=2,
                             rope_theta=500000.0)
    assert not torch.allclose(table, rope_table(str(plain)), rtol=0, atol=1e-5)


def test_rope_freqs_that_are_not_llama3_scaling_are_ignored() -> None:
    from strand.engine_core.model_executor.gguf.rope_freqs import llama3_scaling

    assert llama3_scaling(np.ones(8, dtype=np.float32), 10000.0, 16) is None
    assert llama3_scaling(np.linspace(0.5, 2.0, 8, dtype=np.float32), 10000.0, 16) is None
    assert llama3_scaling(np.ones(5, dtype=np.float32), 10000.0, 16) is None  # wrong length


def test_a_converted_directory_names_the_file_it_was_made_from(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # `strand serve` hands its stages the converted directory; quantization='gguf' then finds the
    # file's blocks from it, while the file is there unchanged.
    from strand.engine_core.default_model import gguf_file

    model_dir, path = _tiny_gguf(tmp_path, monkeypatch, "Q8_0")
    converted = gguf_to_hf_dir(path)
    assert gguf_file(str(converted)) == str(path.resolve())
    assert gguf_file(str(model_dir)) is None  # a directory made from no GGUF file
    engine = LLMEngine.from_engine_args(EngineArgs(model=str(converted), quantization="gguf"))
    assert engine.engine_core.runner.model.lm_head.qtype == 8
    path.write_bytes(path.read_bytes() + b"\0")  # the file changed since: not its source now
    assert gguf_file(str(converted)) is None


def test_tensors_read_in_pieces_of_rows_equal_the_whole(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A few rows dequantized at a time (the piece here 1024 weights: 16 rows of 64), rows and
    # columns read as a tensor-parallel rank reads them: the same as the whole tensor at once.
    from strand.engine_core.model_executor.gguf import tensors as gguf_tensors

    model_dir, path = _tiny_gguf(tmp_path, monkeypatch, "Q4_1")
    whole = gguf_weights(path)
    monkeypatch.setattr(gguf_tensors, "PIECE_WEIGHTS", 1024)
    pieces = gguf_weights(path)
    assert whole.keys() == pieces.keys()
    for name, t in whole.items():
        assert torch.equal(pieces[name], t), name
    config = json.loads((gguf_to_hf_dir(path) / "config.json").read_text())
    with GGUFWeights(path, config) as f:
        for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.0.mlp.up_proj.weight"):
            part, t = f.get_slice(name), whole[name]
            assert part.get_shape() == list(t.shape)
            assert torch.equal(part[5:37], t[5:37]) and torch.equal(part[:, 8:40], t[:, 8:40])
        with pytest.raises(IndexError, match="contiguous rows or columns"):
            f.get_slice(name)[0:10:2]


def test_the_tensor_table_equals_ggufs_reader(tmp_path: Path) -> None:
    # read_tensors walks past the metadata (the vocabulary's strings, arrays of numbers) to
    # the same tensors, types, shapes and bytes as gguf's own reader.
    from strand.engine_core.model_executor.gguf.tensor_table import read_tensors

    model_dir = build_tiny_model(tmp_path / "tiny", hidden_size=64, num_heads=4, num_kv_heads=2)
    for kind in ("F32", "F16", "BF16", "Q4_1"):
        path = tmp_path / f"tiny-{kind}.gguf"
        write_gguf(model_dir, path, kind)
        ours, theirs = read_tensors(path), gguf.GGUFReader(str(path)).tensors
        assert [t.name for t in ours] == [t.name for t in theirs] and len(ours) > 10
        for a, b in zip(ours, theirs, strict=True):
            assert a.tensor_type == b.tensor_type and np.array_equal(a.shape, b.shape)
            assert a.data.dtype == b.data.dtype and np.array_equal(a.data, b.data), a.name
    broken = tmp_path / "broken.gguf"
    broken.write_bytes((tmp_path / "tiny-F32.gguf").read_bytes()[:200])
    with pytest.raises(ValueError, match="ends inside its GGUF header|runs past the end"):
        read_tensors(broken)
    with pytest.raises(ValueError, match="is not a GGUF file"):
        read_tensors(model_dir / "config.json")


def test_a_directory_whose_file_is_gone_says_so_and_old_copies_are_removed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from strand.engine_core.model_executor.gguf.convert import SOURCE_FILE, cached_dir

    model_dir, path = _tiny_gguf(tmp_path, monkeypatch, "Q8_0")
    # What earlier versions left: the same file's float32 copy in a directory of their own
    # (version 2's had no record of its source: it is found by its key).
    olds = [cached_dir(path, version) for version in ("2", "3")]
    for old in olds:
        old.mkdir(parents=True)
        (old / "model.safetensors").write_bytes(b"\0" * 64)
    (olds[1] / SOURCE_FILE).write_text(json.dumps({"path": str(path.resolve())}))
    other = cached_dir(path).parent / f"{path.stem}-ba9876543210"  # another file of that name
    other.mkdir()
    (other / "model.safetensors").write_bytes(b"\0")
    converted = gguf_to_hf_dir(path)
    assert not any(old.exists() for old in olds) and other.is_dir() and converted.is_dir()
    path.unlink()
    with pytest.raises(FileNotFoundError, match="holds no weights: they are read from .*"
                                                "tiny-Q8_0.gguf.*gone or has changed"):
        LLMEngine.from_engine_args(EngineArgs(model=str(converted)))


def test_each_tensor_parallel_rank_reads_its_shard_of_the_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A rank reads its rows (q/k un-permuted first) or columns of each tensor from the file,
    # as it does from safetensors; loading takes no collective, so no process group is made.
    from strand.engine_core.distributed.parallel_state import TPGroup
    from strand.engine_core.model_executor.loader import load_model
    from strand.engine_core.model_executor.model_config import load_model_config

    model_dir, path = _tiny_gguf(tmp_path, monkeypatch, "Q8_0")
    config = load_model_config(str(gguf_to_hf_dir(path)), "float32")
    whole = load_model(config, torch.device("cpu")).state_dict()
    layer = "model.layers.0."
    for rank in range(2):
        tp = TPGroup(rank=rank, world_size=2, local_rank=rank, timeout_s=10.0)
        shard = load_model(config, torch.device("cpu"), tp).state_dict()
        q = whole[f"{layer}self_attn.qkv_proj.weight"][:64]
        got_q = shard[f"{layer}self_attn.qkv_proj.weight"][:32]
        assert torch.equal(got_q, q[32 * rank:32 * (rank + 1)])
        down = whole[f"{layer}mlp.down_proj.weight"]
        width = down.shape[1] // 2
        assert torch.equal(shard[f"{layer}mlp.down_proj.weight"],
                           down[:, width * rank:width * (rank + 1)])


def _mapped_kib(path: Path) -> int:
    """Resident KiB of this process's mappings of `path` (/proc/self/smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()
            if head and "-" in head[0] and not head[0].endswith(":"):
                inside = len(head) > 5 and head[5] == str(path)
            elif inside and head[:1] == ["Rss:"]:
                total += int(head[1])
    return total


@pytest.mark.skipif(not Path("/proc/self/smaps").is_file(), reason="needs /proc/self/smaps")
def test_a_read_tensors_file_pages_leave_the_resident_set(tmp_path: Path) -> None:
    """After the loader has read a tensor, its file pages no longer count in the process's RSS
    (a model is not held twice: its copy and the file); the data reads the same again."""
    from strand.engine_core.model_executor.gguf.tensor_table import read_tensors, release

    path = tmp_path / "big.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    values = np.arange(2 << 20, dtype=np.float32).reshape(1024, 2048)  # 8 MiB
    w.add_tensor("token_embd.weight", values)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    [t] = read_tensors(path)
    assert float(np.asarray(t.data, dtype=np.float64).sum()) == float(values.sum(dtype=np.float64))
    assert _mapped_kib(path) >= 8 << 10
    release(t.data)
    assert _mapped_kib(path) < 64
    assert np.array_equal(np.asarray(t.data), values)  # mapped again on reading
    release(np.zeros(4))  # not a file's pages: nothing to do
