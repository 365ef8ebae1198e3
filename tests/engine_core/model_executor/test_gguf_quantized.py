"""EngineArgs(quantization="gguf"): a GGUF file's Q8_0 / Q4_0 / Q4_1 linear weights stay packed
and are read so, giving the outputs of the same file dequantized at load (the float path); the
K-quants and Q5_0 / Q5_1 (a Q4_K_M or Q5_K_M file) are rewritten exactly into the kernels' block
types (strand/kernels/gguf_transcode.py) and give them too."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import torch

gguf = pytest.importorskip("gguf")

from strand.engine_core import EngineArgs, LLMEngine, SamplingParams  # noqa: E402
from strand.engine_core.model_executor.gguf.quantized import _packed  # noqa: E402
from strand.engine_core.model_executor.layers.gguf_linear import GGUFLinear  # noqa: E402
from strand.engine_core.model_executor.layers.linear import Linear  # noqa: E402
from strand.engine_core.model_executor.models import llama_fused_decode as fused_decode  # noqa: E402
from strand.engine_core.outputs import RequestOutput  # noqa: E402
from strand.kernels import cpu_gguf_linear  # noqa: E402
from strand.kernels.gguf_linear_ref import NAMES  # noqa: E402
from tests.conftest import build_tiny_model  # noqa: E402
from tests.engine_core.model_executor.conftest import count_fused_calls  # noqa: E402
from tests.engine_core.model_executor.gguf_writer import write_gguf  # noqa: E402
from tests.greedy_compare import assert_greedy_within_rounding  # noqa: E402

# 3 requests prefill 11 tokens in one step (the packed kernel over tiles, 4 rows a pass) and
# decode through the fused C++ layer; 5 prefill 18 tokens and decode 5 rows a step (past
# SMALL_M: the stack's batch, where every weight is tiles).
PROMPTS = [[5, 9, 13, 200, 7, 8, 30], [100, 101, 102], [42], [17, 18, 19, 20, 21], [3, 3]]
# Past the first five: a decode batch of several row groups a tile (MANY_REQUESTS).
PROMPTS += [[(7 * i + j) % 250 + 1 for j in range(2 + i % 5)] for i in range(12)]
MANY_REQUESTS = 17


@pytest.fixture(scope="module", autouse=True)
def _cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    # The converted directories go under the test's tmp dir, not the user's cache.
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STRAND_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        yield


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gguf-quantized")
    model_dir = build_tiny_model(root / "tiny", hidden_size=64, num_heads=4, num_kv_heads=2,
                                 intermediate_size=128)
    tied_dir = build_tiny_model(root / "tied", hidden_size=64, num_heads=4, num_kv_heads=2,
                                intermediate_size=96, tie_word_embeddings=True)
    out = {}
    for qtype in ("Q8_0", "Q4_0", "Q4_1"):
        out[qtype] = root / f"tiny-{qtype}.gguf"
        write_gguf(model_dir, out[qtype], qtype)
    out["tied-Q4_1"] = root / "tied-Q4_1.gguf"
    write_gguf(tied_dir, out["tied-Q4_1"], "Q4_1", {"token_embd.weight": "Q8_0"})
    # Tiled layers and a float lm_head (the tied float32 table).
    out["tied-Q4_1-f32-head"] = root / "tied-Q4_1-f32-head.gguf"
    write_gguf(tied_dir, out["tied-Q4_1-f32-head"], "Q4_1", {"token_embd.weight": "F32"})
    # One layer's k in float32: its fused qkv cannot be packed, the rest can.
    out["mixed"] = root / "mixed.gguf"
    write_gguf(model_dir, out["mixed"], "Q8_0", {"blk.0.attn_k.weight": "F32"})
    # The K-quants need rows of a multiple of 256 weights. A Q4_K_M-like mix (llama.cpp gives
    # attn_v, some ffn_down and the output Q6_K; Q5_0 where a row is not a multiple of 256):
    # qkv Q4_K + Q6_K (-> Q8_F), o Q5_0, gate_up Q4_K, down Q6_K in layer 0 (-> Q6_F) and Q4_K
    # in layer 1, output Q6_K.
    wide_dir = build_tiny_model(root / "wide", hidden_size=256, num_heads=4, num_kv_heads=2,
                                intermediate_size=512)
    out["Q4_K_M"] = root / "wide-Q4_K_M.gguf"
    write_gguf(wide_dir, out["Q4_K_M"], "Q4_K", {
        **{f"blk.{i}.attn_v.weight": "Q6_K" for i in range(2)},
        **{f"blk.{i}.attn_output.weight": "Q5_0" for i in range(2)},
        "blk.0.ffn_down.weight": "Q6_K", "output.weight": "Q6_K", "token_embd.weight": "Q8_0"})
    # Q3_K_M-like: Q3_K (-> Q3_F), with attn_v, attn_output and one ffn_down Q4_K, output Q6_K.
    out["Q3_K_M"] = root / "wide-Q3_K_M.gguf"
    write_gguf(wide_dir, out["Q3_K_M"], "Q3_K", {
        **{f"blk.{i}.attn_v.weight": "Q4_K" for i in range(2)},
        **{f"blk.{i}.attn_output.weight": "Q4_K" for i in range(2)},
        "blk.0.ffn_down.weight": "Q4_K", "output.weight": "Q6_K", "token_embd.weight": "Q8_0"})
    # IQ4_XS (-> IQ4_F), one layer's attn_output IQ4_NL (read as it is), output Q6_K.
    out["IQ4_XS"] = root / "wide-IQ4_XS.gguf"
    write_gguf(wide_dir, out["IQ4_XS"], "IQ4_XS", {
        "blk.0.attn_output.weight": "IQ4_NL", "output.weight": "Q6_K",
        "token_embd.weight": "Q8_0"})
    # Q5_K_M-like: Q5_K, with Q5_1 for q and k (qkv -> Q8_F; the rest Q5_F), o Q5_1.
    out["Q5_K_M"] = root / "wide-Q5_K_M.gguf"
    write_gguf(wide_dir, out["Q5_K_M"], "Q5_K", {
        **{f"blk.{i}.attn_{p}.weight": "Q5_1" for i in range(2) for p in "qk"},
        **{f"blk.{i}.attn_output.weight": "Q5_1" for i in range(2)},
        "token_embd.weight": "Q8_0"})
    return out


def _run(path: Path, quantization: str | None, num_requests: int = 3,
         dtype: str = "float32") -> tuple[list[Any], LLMEngine]:
    engine = LLMEngine.from_engine_args(EngineArgs(
        model=str(path), dtype=dtype, quantization=quantization, device="cpu", block_size=4,
        # the packed CPU kernels: on the CPU on any machine; room for every request at once
        # (5 blocks of 4 hold a prompt of up to 7 tokens and the 10 outputs)
        num_gpu_blocks_override=max(64, 5 * num_requests)))
    params = SamplingParams(temperature=0.0, max_tokens=10, logprobs=5, ignore_eos=True)
    for i, prompt in enumerate(PROMPTS[:num_requests]):
        engine.add_request(str(i), {"prompt_token_ids": prompt}, params)
    done: dict[str, Any] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            assert isinstance(out, RequestOutput)  # a generating engine's
            if out.finished:
                c = out.outputs[0]
                done[out.request_id] = (list(c.token_ids), [
                    {t: lp.logprob for t, lp in step.items()} for step in (c.logprobs or [])])
    return [done[k] for k in sorted(done)], engine


def _model(engine: LLMEngine) -> torch.nn.Module:
    return engine.engine_core.runner.model


def _assert_same_outputs(got: list[Any], want: list[Any]) -> None:
    """Greedy tokens and top logprobs of the dequantized model up to int8 rounding of the
    activations (tests/greedy_compare.py): at most one of the three sequences may part at a
    near-tie."""
    assert assert_greedy_within_rounding(got, want) <= 1


@pytest.mark.parametrize("name", ["Q8_0", "Q4_0", "Q4_1", "tied-Q4_1"])
def test_packed_weights_give_the_dequantized_outputs(files: dict[str, Path], name: str) -> None:
    packed, engine = _run(files[name], "gguf")
    dense, _ = _run(files[name], None)
    _assert_same_outputs(packed, dense)
    model: Any = _model(engine)
    table = model.model.embed_tokens.table  # an untied embedding's blocks: not a layer
    layers = [m for m in model.modules()
              if isinstance(m, GGUFLinear) and (m is not table or m is model.lm_head)]
    # Per layer qkv, o, gate_up, down; and the lm_head (a tied one over the embedding's blocks).
    assert len(layers) == 2 * 4 + 1
    assert isinstance(model.lm_head, GGUFLinear)
    assert model.lm_head.qtype == int(getattr(gguf.GGMLQuantizationType,
                                              "Q8_0" if name == "tied-Q4_1" else name))
    assert not any(isinstance(m, Linear) for m in model.modules())


def _kind(layer: Any) -> str:
    if not isinstance(layer, GGUFLinear):
        return "float"
    return "+".join(NAMES[q] for _, q in layer.parts())


@pytest.mark.parametrize(("name", "kinds"), [
    # q and k in Q4_K, v in Q6_K: each part in its own type (Q4_K, then Q6_F).
    ("Q4_K_M", [("Q4_K+Q6_F", "Q5_0", "Q4_K", "Q6_F"), ("Q4_K+Q6_F", "Q5_0", "Q4_K", "Q4_K"),
                "Q6_F"]),
    ("Q5_K_M", [("Q5_1+Q5_F", "Q5_1", "Q5_F", "Q5_F"), ("Q5_1+Q5_F", "Q5_1", "Q5_F", "Q5_F"),
                "Q5_F"]),
    # Q3_K rewritten into Q3_F (its form: d times a signed scale per 16, times q in -4..3 as
    # nibbles of q + 4).
    ("Q3_K_M", [("Q3_F+Q4_K", "Q4_K", "Q3_F", "Q4_K"), ("Q3_F+Q4_K", "Q4_K", "Q3_F", "Q3_F"),
                "Q6_F"]),
    # The IQ4 codes kept (looked up in the kernel): IQ4_NL as it is, IQ4_XS as IQ4_F (a float32
    # d per 32).
    ("IQ4_XS", [("IQ4_F", "IQ4_NL", "IQ4_F", "IQ4_F"), ("IQ4_F", "IQ4_F", "IQ4_F", "IQ4_F"),
                "Q6_F"]),
])
def test_k_quant_files_are_read_packed_and_give_the_dequantized_outputs(
        files: dict[str, Path], name: str, kinds: list[Any]) -> None:
    packed, engine = _run(files[name], "gguf")
    dense, _ = _run(files[name], None)
    # Each sequence equal up to a near-tie, logprobs within the int8 rounding's reach until then;
    # the wider random model has closer ties than the others (measured: Q5_K_M's two sequences
    # part at step 6, where the dequantized model's top two are 0.013 and 0.034 nats apart).
    assert assert_greedy_within_rounding(packed, dense) <= 2
    model: Any = _model(engine)
    if not cpu_gguf_linear.kernels_apply(torch.empty(0, dtype=torch.uint8)):
        return  # these types are read over the C++ kernels' tiles only: without them, float
    got = [tuple(_kind(getattr(part, attr)) for part, attr in (
        (layer.self_attn, "qkv_proj"), (layer.self_attn, "o_proj"), (layer.mlp, "gate_up_proj"),
        (layer.mlp, "down_proj"))) for layer in model.model.layers]
    assert [*got, _kind(model.lm_head)] == kinds


def test_decode_steps_take_the_fused_layer_over_packed_blocks(
        files: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    count_fused_calls(monkeypatch, calls)
    fused, _ = _run(files["Q4_1"], "gguf")
    monkeypatch.setattr(fused_decode, "applies", lambda *a: False)
    plain, _ = _run(files["Q4_1"], "gguf")
    from strand.kernels._cpu_build import KERNELS

    if KERNELS.module() is not None:
        # The lm_head is the file's Q4_1 blocks: the stack holds it and returns the logits.
        assert calls and set(calls) == {"logits"}, \
            "a 3-request decode step should go through the fused C++ step, lm_head included"
    assert fused == plain  # the same kernels in the same order: bit for bit


@pytest.mark.parametrize(("name", "num_requests"), [("Q4_1", 1), ("Q8_0", 3), ("Q4_K_M", 1),
                                                  ("Q4_K_M", 3), ("Q8_0", 5), ("Q4_K_M", 5),
                                                  ("Q4_K_M", MANY_REQUESTS)])
def test_the_fused_step_over_tiles_splits_its_work_between_threads_bit_for_bit(
        files: dict[str, Path], monkeypatch: pytest.MonkeyPatch, name: str,
        num_requests: int) -> None:
    # Every projection is 16-row tiles here, so the C++ step runs as phases whose chunks any
    # thread takes (strand/kernels/csrc/decode_phased.cpp): 3 threads (more than the 2 kv heads of one
    # request, and as many as 3 requests) must give the 1-thread, the op-by-op
    # (STRAND_DECODE_PHASED=0) and the layer-by-layer outputs. Q4_K_M's qkv is two parts of
    # different types (Q4_K q and k, Q6_F v): a chunk may span both. 5 requests are a decode
    # batch past SMALL_M rows, which the stack takes over tiles too (2 row passes a tile); 17
    # take several row passes a tile, the last of one row.
    threads = torch.get_num_threads()
    calls: list[str] = []
    try:
        with monkeypatch.context() as mp:
            count_fused_calls(mp, calls)
            torch.set_num_threads(1)
            one, _ = _run(files[name], "gguf", num_requests)
            torch.set_num_threads(3)
            three, _ = _run(files[name], "gguf", num_requests)
            mp.setenv("STRAND_DECODE_PHASED", "0")  # read when a stack is made
            op_by_op, _ = _run(files[name], "gguf", num_requests)
        monkeypatch.setattr(fused_decode, "applies", lambda *a: False)
        plain, _ = _run(files[name], "gguf", num_requests)
    finally:
        torch.set_num_threads(threads)
    from strand.kernels._cpu_build import KERNELS

    assert calls or KERNELS.module() is None
    assert three == one
    assert op_by_op == plain
    assert three == plain


@pytest.mark.parametrize("name", ["tied-Q4_1", "tied-Q4_1-f32-head"])
def test_the_step_with_its_lm_head_gives_the_python_heads_logits_bit_for_bit(
        files: dict[str, Path], monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    # The stack holds the lm_head (the embedding's Q8_0 tiles: two more phases of the step's
    # region; or the float table after the phased layers) and returns the logits: 1 and 3
    # threads must give the tokens and logprobs of the Python norm and lm_head.
    threads = torch.get_num_threads()
    calls: list[str] = []
    try:
        with monkeypatch.context() as mp:
            count_fused_calls(mp, calls)
            torch.set_num_threads(3)
            three, engine = _run(files[name], "gguf", 2)
            torch.set_num_threads(1)
            one, _ = _run(files[name], "gguf", 2)
        monkeypatch.setattr(fused_decode, "has_head", lambda *a: False)
        plain, _ = _run(files[name], "gguf", 2)
    finally:
        torch.set_num_threads(threads)
    head = _model(engine).lm_head
    assert isinstance(head, GGUFLinear if name == "tied-Q4_1" else Linear)
    assert calls and set(calls) == {"logits"}
    assert three == one == plain


def test_more_rows_than_the_small_kernel_takes(files: dict[str, Path]) -> None:
    packed, _ = _run(files["Q8_0"], "gguf", num_requests=5)
    dense, _ = _run(files["Q8_0"], None, num_requests=5)
    _assert_same_outputs(packed, dense)


def test_bfloat16_activations_over_packed_weights(files: dict[str, Path]) -> None:
    packed, _ = _run(files["Q8_0"], "gguf", dtype="bfloat16")
    dense, _ = _run(files["Q8_0"], None, dtype="bfloat16")
    # bfloat16 rounds each layer's output (~3 significant digits); the first step's top token,
    # before any rounding difference can feed back, is the same.
    for (tokens, logprobs), (want_tokens, want_logprobs) in zip(packed, dense, strict=True):
        assert tokens[0] == want_tokens[0]
        first = logprobs[0][tokens[0]]
        assert abs(first - want_logprobs[0][tokens[0]]) <= 0.1


def test_a_layer_whose_parts_differ_in_type_stays_dense(files: dict[str, Path]) -> None:
    packed, engine = _run(files["mixed"], "gguf")
    dense, _ = _run(files["mixed"], None)
    _assert_same_outputs(packed, dense)
    model: Any = _model(engine).model
    layers = model.layers
    assert isinstance(layers[0].self_attn.qkv_proj, Linear)
    assert isinstance(layers[1].self_attn.qkv_proj, GGUFLinear)
    assert isinstance(layers[0].self_attn.o_proj, GGUFLinear)


def test_packing_refuses_parts_of_other_types(files: dict[str, Path]) -> None:
    tensors = {t.name: t for t in gguf.GGUFReader(str(files["mixed"])).tensors}
    k, v = tensors["blk.0.attn_k.weight"], tensors["blk.0.attn_v.weight"]
    cpu = torch.device("cpu")
    assert _packed([k], [None], cpu) is None  # F32
    assert _packed([v, None], [None, None], cpu) is None  # a part missing
    got = _packed([v, tensors["blk.1.attn_v.weight"]], [None, None], cpu)
    assert got is not None and len(got[0]) == 1  # one type: one run of rows
    blocks = got[0][0][0]  # GGUF rows, or on CPU with the C++ kernels their 16-row tiles
    assert cpu_gguf_linear.out_features(blocks) == 2 * v.shape[1]
    assert blocks.numel() == 2 * v.shape[1] * v.data.shape[1]


def test_k_quant_layers_stay_float_where_only_tiles_could_read_them(
        files: dict[str, Path]) -> None:
    # Q5_0, Q5_1 and Strand's types have no row kernel and no Triton kernel: on CUDA, or for a
    # row count that is not a multiple of 16, the layer keeps its dequantized weight.
    tensors = {t.name: t for t in gguf.GGUFReader(str(files["Q4_K_M"])).tensors}
    gate, o = tensors["blk.0.ffn_gate.weight"], tensors["blk.0.attn_output.weight"]
    assert _packed([gate], [None], torch.device("cuda")) is None
    assert _packed([o], [None], torch.device("cuda")) is None
    got = _packed([o], [None], torch.device("cpu"))
    assert got is not None and NAMES[got[0][0][1]] == "Q5_0"


def test_parts_of_different_types_keep_their_own_where_tiles_read_them(
        files: dict[str, Path]) -> None:
    # Q4_K_M's qkv: q and k (Q4_K) one run, v (Q6_K -> Q6_F) another, fewer bytes than all
    # rewritten into Q8_F; where tiles cannot read them (CUDA) no packed type holds them all.
    tensors = {t.name: t for t in gguf.GGUFReader(str(files["Q4_K_M"])).tensors}
    qkv = [tensors[f"blk.0.attn_{p}.weight"] for p in "qkv"]
    heads = [4, 2, None]
    got = _packed(qkv, heads, torch.device("cpu"))
    if not cpu_gguf_linear.kernels_apply(torch.empty(0, dtype=torch.uint8)):
        assert got is None
        return
    assert got is not None
    parts, in_features = got
    assert [(NAMES[q], cpu_gguf_linear.out_features(p)) for p, q in parts] == [
        ("Q4_K", 256 + 128), ("Q6_F", 128)]
    assert all(p.dim() == 3 for p, _ in parts)  # read straight into 16-row tiles
    own = sum(p.numel() for p, _ in parts)
    assert own < 0.6 * (256 + 2 * 128) * in_features * 11 / 8  # Q8_F: 11 bits a weight
    assert _packed(qkv, heads, torch.device("cuda")) is None


def test_a_packed_layer_keeps_its_bias_and_its_float_weight_is_never_made(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Qwen2's q/k/v have biases: loaded from the checkpoint into the packed layer. The layers
    # the blocks replace are planned before the weights are read, so their float weights are
    # neither made nor read (the loader skips them).
    from safetensors.torch import load_file

    model_dir = build_tiny_model(tmp_path / "qwen2", arch="qwen2", hidden_size=64, num_heads=4,
                                 num_kv_heads=2, intermediate_size=128)
    path = tmp_path / "qwen2-Q8_0.gguf"
    write_gguf(model_dir, path, "Q8_0")
    from strand.engine_core.model_executor import loader

    made: list[tuple[int, ...]] = []  # the shapes of the parameters the loader makes
    real_to_empty = loader._to_empty

    def to_empty(module: torch.nn.Module, device: torch.device) -> None:
        made.extend(tuple(p.shape) for p in module.parameters(recurse=False))
        real_to_empty(module, device)

    monkeypatch.setattr(loader, "_to_empty", to_empty)
    dense, _ = _run(path, None)
    assert made.count((128, 64)) == 2  # q/k/v's 64 + 32 + 32 rows of 64, in both layers
    made.clear()
    packed, engine = _run(path, "gguf")
    assert (128, 64) not in made and (256, 64) not in made  # q/k/v, gate/up: never made
    _assert_same_outputs(packed, dense)
    qkv = cast(Any, _model(engine)).model.layers[0].self_attn.qkv_proj
    assert isinstance(qkv, GGUFLinear) and qkv.bias is not None
    want = load_file(str(model_dir / "model.safetensors"))
    bias = torch.cat([want[f"model.layers.0.self_attn.{n}_proj.bias"] for n in "qkv"])
    torch.testing.assert_close(qkv.bias.float(), bias.float())


def test_quantization_is_checked() -> None:
    with pytest.raises(ValueError, match="quantization must be one of"):
        EngineArgs(quantization="awq")


def test_gguf_quantization_needs_a_gguf_file(tmp_path: Path) -> None:
    model_dir = build_tiny_model(tmp_path / "hf")
    with pytest.raises(ValueError, match="quantization='gguf' needs a .gguf model file"):
        LLMEngine.from_engine_args(EngineArgs(model=str(model_dir), quantization="gguf"))


def test_sleep_level_2_reloads_the_packed_weights(files: dict[str, Path]) -> None:
    before, engine = _run(files["Q4_1"], "gguf")
    engine.sleep(level=2)
    engine.wake_up()
    params = SamplingParams(temperature=0.0, max_tokens=10, logprobs=3, ignore_eos=True)
    for i, prompt in enumerate(PROMPTS[:3]):
        engine.add_request(f"again-{i}", {"prompt_token_ids": prompt}, params)
    after: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            assert isinstance(out, RequestOutput)  # a generating engine's
            if out.finished:
                after[out.request_id] = list(out.outputs[0].token_ids)
    assert [after[f"again-{i}"] for i in range(3)] == [tokens for tokens, _ in before]
    # 4 projections a layer, the lm_head, and the (untied) embedding table's blocks.
    assert sum(isinstance(m, GGUFLinear) for m in _model(engine).modules()) == 2 * 4 + 2


def test_a_gguf_file_loaded_dequantized_says_how_to_keep_its_blocks(
        files: dict[str, Path], caplog: pytest.LogCaptureFixture) -> None:
    # vLLM reads a .gguf model packed without being asked; here the default is transformers'
    # dequantized result, so the log says so and names the flag.
    with caplog.at_level("INFO", logger="strand.engine_core.core.engine"):
        LLMEngine.from_engine_args(EngineArgs(model=str(files["Q8_0"]), device="cpu",
                                              num_gpu_blocks_override=8, block_size=4))
    hint = [r.getMessage() for r in caplog.records if "dequantized to" in r.getMessage()]
    assert hint == ["tiny-Q8_0.gguf: every weight dequantized to float32 at load, as "
                    "transformers' gguf_file= does; --quantization gguf keeps the linear weights "
                    "in their blocks, as llama.cpp and vLLM read them (about the file's size in "
                    "memory)"]
    caplog.clear()
    with caplog.at_level("INFO", logger="strand.engine_core.core.engine"):
        LLMEngine.from_engine_args(EngineArgs(model=str(files["Q8_0"]), device="cpu",
                                              quantization="gguf", num_gpu_blocks_override=8,
                                              block_size=4))
    assert not [r for r in caplog.records if "dequantized to" in r.getMessage()]


@pytest.mark.parametrize(("name", "kept"), [
    ("Q8_0", "own"), ("tied-Q4_1", "head"), ("Q4_K_M", "own"), ("tied-Q4_1-f32-head", None)])
def test_the_embedding_table_stays_in_the_files_blocks(files: dict[str, Path], name: str,
                                                       kept: str | None) -> None:
    """Kept in blocks (the tied lm_head's, or its own token_embd's), looked up rows are the
    dequantized table's bit for bit, and no float table is made; a float token_embd stays a
    float table."""
    from strand.engine_core.model_executor.layers.gguf_embedding import GGUFEmbedding

    _, engine = _run(files[name], "gguf", num_requests=1)
    _, dense_engine = _run(files[name], None, num_requests=1)
    model: Any = _model(engine)
    embed, dense = model.model.embed_tokens, cast(Any, _model(dense_engine)).model.embed_tokens
    ids = torch.tensor([[0, 17, 255], [16, 15, dense.num_embeddings - 1]])
    if kept is None:  # a float table (here read from the tied head's float32 panels)
        assert not isinstance(embed, GGUFEmbedding)
        with torch.inference_mode():
            assert torch.equal(embed(ids), dense(ids))
        return
    assert isinstance(embed, GGUFEmbedding)
    assert (embed.table is model.lm_head) == (kept == "head")
    assert not any(p.dtype.is_floating_point and p.numel() >= embed.num_embeddings
                   * embed.embedding_dim for p in embed.parameters())
    with torch.inference_mode():
        assert torch.equal(embed(ids), dense(ids))
    with pytest.raises(IndexError, match="token ids must be in"):
        embed(torch.tensor([embed.num_embeddings]))


def test_a_tensor_transcoded_a_piece_of_rows_at_a_time_is_the_whole_ones_blocks(
        files: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """Large tables are rewritten a piece of rows at a time (small temporaries): the same
    bytes as rewriting them whole."""
    import numpy as np

    from strand.engine_core.model_executor.gguf import quantized
    from strand.engine_core.model_executor.gguf.tensor_table import read_tensors
    from strand.kernels.gguf_linear_ref import Q6_F
    from strand.kernels.gguf_transcode import transcode

    [t] = [t for t in read_tensors(files["Q4_K_M"]) if t.name == "output.weight"]  # Q6_K
    whole = transcode(np.asarray(t.data, dtype=np.uint8).reshape(int(t.shape[1]), -1),
                      int(t.tensor_type), Q6_F)
    row_bytes = int(np.asarray(t.data).reshape(int(t.shape[1]), -1).shape[1])
    monkeypatch.setattr(quantized, "_TRANSCODE_PIECE", 3 * row_bytes)  # 3 rows a piece
    assert np.array_equal(quantized._transcoded(t, Q6_F), whole)


def test_a_table_tiled_a_piece_of_rows_at_a_time_is_the_whole_ones_tiles(
        files: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """On CPU a weight is read, rewritten and tiled a piece of rows at a time into its one final
    tensor (the file's rows, their rewrite and their tiles never all whole at once): the same
    bytes as tiling the whole rewrite."""
    import numpy as np

    from strand.engine_core.model_executor.gguf import quantized
    from strand.engine_core.model_executor.gguf.tensor_table import read_tensors
    from strand.kernels.gguf_linear_ref import Q6_F
    from strand.kernels.gguf_transcode import transcode

    if not cpu_gguf_linear.kernels_apply(torch.empty(0, dtype=torch.uint8)):
        pytest.skip("the C++ kernels are not built: no tiles")
    [t] = [t for t in read_tensors(files["Q4_K_M"]) if t.name == "output.weight"]  # Q6_K
    rows = np.asarray(t.data, dtype=np.uint8).reshape(int(t.shape[1]), -1)
    whole = cpu_gguf_linear.gguf_tile(torch.from_numpy(transcode(rows, int(t.tensor_type), Q6_F)),
                                      Q6_F, int(t.shape[0]))
    monkeypatch.setattr(quantized, "_TRANSCODE_PIECE", 3 * rows.shape[1])  # 16 rows a piece
    assert len(quantized._pieces(t, None)) == rows.shape[0] // 16 > 1
    [(tiles, qtype)] = quantized._read_parts([t], [None], [Q6_F], torch.device("cpu"))
    assert qtype == Q6_F and torch.equal(tiles, whole)
