"""Structured outputs with a real vocabulary (SmolLM2-135M-Instruct's 49152-token byte-level
BPE, from the GGUF file): the grammar engine reads the tokenizer right, and the outputs of a real
model satisfy each constraint, in the text the detokenizer produces."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from strand.engine_core import EngineArgs, LLMEngine, SamplingParams, StructuredOutputsParams
from strand.engine_core.outputs import RequestOutput

pytest.importorskip("gguf")

CITY_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20},
                   "country": {"type": "string", "maxLength": 20},
                   "population_millions": {"type": "integer", "minimum": 0, "maximum": 50}},
    "required": ["city", "country", "population_millions"],
    "additionalProperties": False,
}


@pytest.mark.slow  # loads a 135M model and compiles against its vocabulary: ~15 s on 2 cores
def test_real_model_outputs_satisfy_their_constraints(smollm2_gguf: Path) -> None:
    engine = LLMEngine.from_engine_args(EngineArgs(model=str(smollm2_gguf), dtype="float32"))
    ask = {"messages": [{"role": "user", "content": "Describe Paris as JSON."}]}
    cases: dict[str, tuple[str | dict[str, Any], StructuredOutputsParams]] = {
        "json": (ask, StructuredOutputsParams(json=CITY_SCHEMA, disable_any_whitespace=True)),
        "choice": ("Is the sky blue? Answer:", StructuredOutputsParams(choice=["Yes", "No"])),
    }
    for name, (prompt, constraint) in cases.items():
        engine.add_request(name, prompt, SamplingParams(temperature=0.0, max_tokens=48,
                                                        structured_outputs=constraint))
    finished = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            assert isinstance(out, RequestOutput)  # a generating engine's
            if out.finished:
                finished[out.request_id] = out.outputs[0]
    assert all(out.finish_reason == "stop" for out in finished.values()), finished
    city = json.loads(finished["json"].text)
    assert set(city) == {"city", "country", "population_millions"}
    assert isinstance(city["population_millions"], int) and city["city"]
    assert finished["choice"].text in ("Yes", "No")
