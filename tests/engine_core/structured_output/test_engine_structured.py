"""Structured outputs through the whole engine on the tiny random model: every output satisfies
its constraint, whatever else shares the batch, across preemption, n > 1 and ignore_eos."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from strand.engine_core import RequestOutputKind, SamplingParams, StructuredOutputsParams
from strand.engine_core.core.engine_io import EngineCoreRequest
from tests.engine_core.engine.conftest import assert_pool_whole, make_engine, run_to_completion
from tests.engine_core.structured_output.constraints import (
    KINDS,
    PERSON_SCHEMA,
    assert_satisfies,
    constraint,
)

MAX_TOKENS = 48  # every constraint above ends well within this many tokens


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path):
    return make_engine(tiny_model_dir, max_num_seqs=16)


def _json_object_bias(engine) -> dict[int, float]:
    """Random weights would wander through an unbounded JSON object; a bias toward "}" and EOS
    makes it end (the grammar still has to put "{" first, against the bias on "}")."""
    tok = engine.tokenizer
    close = tok.encode("}", add_special_tokens=False)
    assert len(close) == 1
    return {close[0]: 50.0, tok.eos_token_id: 50.0}


def _params(engine, kind: str, temperature: float, **extra) -> SamplingParams:
    bias = _json_object_bias(engine) if kind == "json_object" else None
    return SamplingParams(max_tokens=MAX_TOKENS, temperature=temperature, seed=7,
                          structured_outputs=constraint(kind), logit_bias=bias, **extra)


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
def test_every_kind_in_one_batch_with_unconstrained_requests(engine, temperature: float) -> None:
    for kind in KINDS:
        engine.add_request(kind, "hello world", _params(engine, kind, temperature))
    # Unconstrained neighbours: their rows must stay free (they run to max_tokens).
    for i in range(2):
        engine.add_request(f"free-{i}", "the quick", SamplingParams(
            max_tokens=12, temperature=temperature, seed=i, ignore_eos=True))
    finished = run_to_completion(engine)
    for kind in KINDS:
        out = finished[kind].outputs[0]
        assert out.finish_reason == "stop", (kind, out.text)
        assert out.token_ids[-1] == engine.tokenizer.eos_token_id
        assert_satisfies(kind, out.text)
    for i in range(2):
        assert len(finished[f"free-{i}"].outputs[0].token_ids) == 12
    assert_pool_whole(engine)


def test_unconstrained_output_is_unchanged_by_a_constrained_neighbour(engine) -> None:
    params = SamplingParams(max_tokens=10, temperature=0.0)
    engine.add_request("alone", "the quick", params)
    alone = run_to_completion(engine)["alone"].outputs[0].token_ids
    engine.add_request("c", "hello world", _params(engine, "json", 0.0))
    engine.add_request("mixed", "the quick", params)
    assert run_to_completion(engine)["mixed"].outputs[0].token_ids == alone


def test_n_samples_each_satisfy_the_constraint(engine) -> None:
    # FINAL_ONLY gathers all n at the end (streaming kinds send the children of each step).
    engine.add_request("n", "hello world", _params(engine, "choice", 1.0, n=4,
                                                   output_kind=RequestOutputKind.FINAL_ONLY))
    outputs = run_to_completion(engine)["n"].outputs
    assert len(outputs) == 4
    for out in outputs:
        assert_satisfies("choice", out.text)


def test_same_spec_compiles_once(engine) -> None:
    cache = engine.engine_core.grammar_cache()
    # The same schema as a str with other key order is the same grammar.
    same = StructuredOutputsParams(json=json.dumps(dict(reversed(PERSON_SCHEMA.items()))),
                                   disable_any_whitespace=True)
    # Both compiled here first: the engine is the module's, and other tests may not have run
    # in this process (a parallel run hands them to other workers).
    engine.add_request("a", "x", _params(engine, "regex", 0.0))
    engine.add_request("b", "x", _params(engine, "json", 0.0))
    run_to_completion(engine)
    before = cache.num_compiled
    for i in range(3):
        engine.add_request(f"r{i}", "x", _params(engine, "regex", 1.0))
        engine.add_request(f"j{i}", "x", SamplingParams(max_tokens=MAX_TOKENS,
                                                        structured_outputs=same))
    run_to_completion(engine)
    assert cache.num_compiled == before  # regex and schema both already compiled


@pytest.mark.parametrize("field,spec,match", [
    ("json", '{"type": "object", "properties": 5}', r"structured_outputs\.json is invalid"),
    ("json", "{not json", r"structured_outputs\.json must be a JSON schema"),
    ("regex", "(ab", r"structured_outputs\.regex is invalid"),
    ("grammar", 'root ::= "a" |', r"structured_outputs\.grammar is invalid"),
])
def test_invalid_spec_is_refused_and_leaves_the_engine_untouched(engine, field: str, spec: str,
                                                                 match: str) -> None:
    with pytest.raises(ValueError, match=match):
        engine.add_request("bad", "hello", SamplingParams(
            structured_outputs=StructuredOutputsParams(**{field: spec})))  # type: ignore[arg-type]
    assert not engine.has_unfinished_requests()
    # The id was not taken and the engine still serves.
    engine.add_request("bad", "hello", _params(engine, "choice", 0.0))
    assert_satisfies("choice", run_to_completion(engine)["bad"].outputs[0].text)


def test_engine_core_refuses_an_invalid_spec_before_adding(engine) -> None:
    core = engine.engine_core
    params = SamplingParams(structured_outputs=StructuredOutputsParams(regex="[a-"))
    with pytest.raises(ValueError, match=r"structured_outputs\.regex"):
        core.add_request(EngineCoreRequest("core-bad", [5, 6, 7], params, eos_token_id=2))
    assert "core-bad" not in core.scheduler.requests
    assert not core.has_unfinished_requests()


def test_ignore_eos_keeps_the_finished_grammar_on_eos(engine) -> None:
    engine.add_request("ie", "hello", _params(engine, "choice", 1.0, ignore_eos=True))
    out = run_to_completion(engine)["ie"].outputs[0]
    # The choice ends in a few tokens; after it only EOS is allowed, up to max_tokens.
    assert len(out.token_ids) == MAX_TOKENS and out.finish_reason == "length"
    assert_satisfies("choice", out.text)
    first_eos = out.token_ids.index(engine.tokenizer.eos_token_id)
    assert set(out.token_ids[first_eos:]) == {engine.tokenizer.eos_token_id}


def test_outputs_survive_preemption(tiny_model_dir: Path) -> None:
    # 15 blocks of 4 tokens for 6 requests of 4 + up to 48 tokens: some must be preempted.
    engine = make_engine(tiny_model_dir, block_size=4, num_gpu_blocks_override=16,
                         max_num_seqs=6)
    prompt = {"prompt_token_ids": [5, 6, 7, 8]}
    kinds = ["json", "regex", "grammar", "json", "regex", "grammar"]
    for i, kind in enumerate(kinds):
        engine.add_request(str(i), prompt, _params(engine, kind, 1.0))
    finished = run_to_completion(engine)
    assert engine.engine_core.scheduler.make_stats().num_preemptions > 0
    for i, kind in enumerate(kinds):
        assert_satisfies(kind, finished[str(i)].outputs[0].text)
    assert_pool_whole(engine)


def test_batch_queue_keeps_matchers_in_step(tiny_model_dir: Path) -> None:
    # Two batches in flight: step N+1 is scheduled before N's token is known; the runner's
    # matcher has still advanced on it by the time N+1 is sampled.
    engine = make_engine(tiny_model_dir, max_concurrent_batches=2)
    for kind in KINDS:
        engine.add_request(kind, "hello world", _params(engine, kind, 1.0))
    finished = run_to_completion(engine)
    for kind in KINDS:
        assert_satisfies(kind, finished[kind].outputs[0].text)


LARK_SQL = """
start: select
select: "SELECT " column " FROM " table " WHERE " column " = " number
column: "col_1" | "col_2"
table: "table_1" | "table_2"
number: "1" | "2" | "3"
"""


def test_lark_grammar_holds_and_a_non_grammar_is_refused(engine) -> None:
    # vLLM's rule: no `::=` means Lark. Its SQL case, on the tiny model.
    engine.add_request("lark", "hello", SamplingParams(
        max_tokens=MAX_TOKENS, temperature=1.0, seed=1,
        structured_outputs=StructuredOutputsParams(grammar=LARK_SQL)))
    text = run_to_completion(engine)["lark"].outputs[0].text
    assert re.fullmatch(r"SELECT col_[12] FROM table_[12] WHERE col_[12] = [123]", text), text
    with pytest.raises(ValueError, match=r"structured_outputs\.grammar is invalid"):
        engine.add_request("nog", "hello", SamplingParams(
            structured_outputs=StructuredOutputsParams(grammar="not a grammar")))
    assert not engine.has_unfinished_requests()
