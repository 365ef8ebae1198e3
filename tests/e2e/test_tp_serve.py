"""`strand serve --tensor-parallel-size 2` over gRPC gives the in-process TP=1 engine's greedy
outputs: the engine service is rank 0, its worker rank a process it spawned (gloo, loopback).
The batch holds a LoRA request and a choice-guided one too (LoRA and structured outputs on TP)."""

from __future__ import annotations

from pathlib import Path

from strand.engine_core import LoRARequest
from strand.engine_core.config import EngineArgs
from strand.engine_core.llm_engine import LLMEngine
from strand.engine_core.outputs import RequestOutput
from strand.engine_core.sampling_params import SamplingParams
from strand.services.client import EngineClient
from tests.e2e.conftest import ENGINE_FLAGS, start_stack
from tests.engine_core.lora.conftest import make_peft_adapter
from tests.engine_core.structured_output.constraints import assert_satisfies, constraint

PROMPTS = ["one two three", "The quick brown fox", "é 中 tokens"]


def _run(engine: LLMEngine | EngineClient, lora: LoRARequest
         ) -> list[tuple[str, list[int], str, str | None]]:
    params = SamplingParams(temperature=0.0, max_tokens=6)
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(str(i), prompt, params)
    engine.add_request("lora", PROMPTS[0], params, lora_request=lora)
    engine.add_request("choice", PROMPTS[1], SamplingParams(
        temperature=0.0, max_tokens=16, structured_outputs=constraint("choice")))
    finished: dict[str, RequestOutput] = {}
    for _ in range(100):
        if not engine.has_unfinished_requests():
            break
        finished.update((o.request_id, o) for o in engine.step()
                        if isinstance(o, RequestOutput) and o.finished)
    return [(r, list(finished[r].outputs[0].token_ids), finished[r].outputs[0].text,
             finished[r].outputs[0].finish_reason) for r in sorted(finished)]


def test_serve_with_two_ranks_matches_one_rank_in_process(tiny_model_dir: Path,
                                                          tmp_path: Path) -> None:
    lora = LoRARequest("a", 1, str(make_peft_adapter(tiny_model_dir, tmp_path / "a", seed=5)))
    local = LLMEngine.from_engine_args(EngineArgs(
        model=str(tiny_model_dir), max_num_seqs=int(ENGINE_FLAGS[1]),
        kv_cache_memory=int(ENGINE_FLAGS[3]), device="cpu", dtype="float32",
        enable_lora=True, max_lora_rank=8))
    expected = _run(local, lora)
    assert len(expected) == len(PROMPTS) + 2
    outputs = {request_id: (tokens, text) for request_id, tokens, text, _ in expected}
    assert outputs["lora"][0] != outputs["0"][0]  # the adapter counts
    assert_satisfies("choice", outputs["choice"][1])
    with start_stack(tiny_model_dir, tmp_path, ["--self-step-after", "3600"],
                     engine_args=["--tensor-parallel-size", "2", "--cpu-threads", "1",
                                  "--device", "cpu", "--dtype", "float32",
                                  "--enable-lora", "--max-lora-rank", "8"]) as stack:
        with EngineClient(stack.gateway_address, timeout=60) as client:
            assert _run(client, lora) == expected
    # The engine service really ran two ranks (not one, silently).
    assert "rank 0 of 2 joined" in (tmp_path / "engine.log").read_text(encoding="utf-8")
