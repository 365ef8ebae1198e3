"""StructuredOutputsParams' rules, the grammar cache's bounds and the bitmask's effect on logits,
without an engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from strand.engine_core import SamplingParams, StructuredOutputsParams
from strand.engine_core.processing.tokenizer import Tokenizer
from strand.engine_core.structured_output.bitmask import apply_grammar_mask, build_grammar_mask
from strand.engine_core.structured_output.grammar import GrammarCache, tokenizer_info


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_dir(tiny_model_dir)


@pytest.fixture(scope="module")
def info(tokenizer: Tokenizer):
    return tokenizer_info(tokenizer, 512, tokenizer.eos_token_id)


@pytest.mark.parametrize("kwargs,match", [
    ({}, "exactly one of .* got none"),
    ({"regex": "a", "choice": ["a"]}, "exactly one of .* got regex, choice"),
    ({"choice": []}, "choice must be a non-empty list"),
    ({"choice": ["a", ""]}, "choice must be a non-empty list of non-empty strings"),
    ({"choice": ["a"] * 1025}, "choice must have <= 1024 entries"),
    ({"json": 5}, "json must be a str or a dict"),
    ({"json": "[1, 2]"}, "json must be a JSON schema"),
    ({"regex": "x" * 70_000}, "regex must be at most 65536 characters"),
    ({"grammar": ""}, "grammar must be a non-empty str"),
])
def test_params_refuse_bad_shapes_naming_the_field(kwargs, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        StructuredOutputsParams(**kwargs)


def test_sampling_params_take_a_dict_and_refuse_unknown_keys() -> None:
    params = SamplingParams(structured_outputs={"regex": "[ab]+"})  # type: ignore[arg-type]
    assert params.structured_outputs == StructuredOutputsParams(regex="[ab]+")
    with pytest.raises(ValueError, match="structured_outputs has unknown keys"):
        SamplingParams(structured_outputs={"regexp": "a"})  # type: ignore[arg-type]


def test_syntax_errors_name_the_field(info) -> None:
    cache = GrammarCache(info)
    with pytest.raises(ValueError, match=r"structured_outputs\.regex is invalid: .*parenthesis"):
        cache.compile(StructuredOutputsParams(regex="(ab"))
    assert len(cache) == 0  # nothing cached for a spec that does not compile
    # Quotes, backslashes, newlines and non-ASCII survive the choice -> EBNF escaping.
    choices = ['a"b', "c\\d", "é\n中"]
    for choice in choices:
        matcher = cache.new_matcher(StructuredOutputsParams(choice=choices), None)
        assert matcher.accept_string(choice) and matcher.is_completed(), choice


def test_cache_keeps_at_most_max_entries_least_recent_out(info) -> None:
    cache = GrammarCache(info, max_entries=2)
    a, b, c = (StructuredOutputsParams(regex=r) for r in ("a+", "b+", "c+"))
    first = cache.compile(a)
    cache.compile(b)
    assert cache.compile(a) is first  # a hit, and a is now the most recent
    cache.compile(c)  # evicts b
    assert len(cache) == 2 and cache.num_compiled == 3
    cache.compile(a)
    assert cache.num_compiled == 3
    cache.compile(b)
    assert cache.num_compiled == 4


def test_mask_leaves_only_grammar_tokens_and_free_rows_untouched(info, tokenizer) -> None:
    cache = GrammarCache(info)
    matcher = cache.new_matcher(StructuredOutputsParams(choice=["yes", "no"]),
                                tokenizer.eos_token_id)
    logits = torch.randn(2, 512)
    free_row = logits[1].clone()
    mask = build_grammar_mask([matcher, None], [tokenizer.eos_token_id, None], 512)
    assert mask is not None and mask.rows == [0]
    apply_grammar_mask(logits, mask)
    allowed = torch.isfinite(logits[0]).nonzero().flatten().tolist()
    assert allowed  # every allowed token starts "yes" or "no"
    for token in allowed:
        text = tokenizer.decode([token])
        assert "yes".startswith(text) or "no".startswith(text), text
    assert torch.equal(logits[1], free_row)
    assert build_grammar_mask([None, None], [None, None], 512) is None


def test_a_finished_grammar_allows_only_eos(info, tokenizer) -> None:
    eos = tokenizer.eos_token_id
    matcher = GrammarCache(info).new_matcher(StructuredOutputsParams(choice=["no"]), eos)
    for token in tokenizer.encode("no", add_special_tokens=False):
        assert matcher.accept_token(token)
    assert matcher.accept_token(eos) and matcher.is_terminated()
    logits = torch.zeros(1, 512)
    mask = build_grammar_mask([matcher], [eos], 512)
    assert mask is not None
    apply_grammar_mask(logits, mask)
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [eos]


def test_special_and_padding_tokens_are_never_allowed(tokenizer) -> None:
    # 8 ids past the tokenizer's vocab: a model may pad its embedding table.
    info = tokenizer_info(tokenizer, 520, tokenizer.eos_token_id)
    matcher = GrammarCache(info).new_matcher(StructuredOutputsParams(regex=r"[<>|a-z/]+"),
                                             tokenizer.eos_token_id)
    logits = torch.zeros(1, 520)
    mask = build_grammar_mask([matcher], [tokenizer.eos_token_id], 520)
    assert mask is not None
    apply_grammar_mask(logits, mask)
    allowed = set(torch.isfinite(logits[0]).nonzero().flatten().tolist())
    assert allowed and not allowed & set(range(512, 520))
    # "<|user|>" and "</s>" spell text the regex accepts, but as special tokens they never are.
    assert not allowed & tokenizer.all_special_ids


def test_compiles_run_in_the_background_once_per_spec(info) -> None:
    cache = GrammarCache(lambda: info)  # the vocabulary view is built on the compile thread
    params = StructuredOutputsParams(json={"type": "object"})
    first = cache.compile_async(params)
    again = cache.compile_async(StructuredOutputsParams(json='{"type":  "object"}'))
    assert again is first and cache.num_compiled == 1  # one compile in flight, shared
    assert first.result(timeout=60) is cache.compile(params)
    # A spec that does not parse fails at once, in the caller's thread, and is not cached.
    with pytest.raises(ValueError, match=r"structured_outputs\.grammar is invalid"):
        cache.compile_async(StructuredOutputsParams(grammar="root ::= ("))
    assert len(cache) == 1


def test_sampler_applies_the_grammar_before_logit_bias(info, tokenizer) -> None:
    from strand.engine_core.model_executor.sampler import Sampler
    from strand.engine_core.model_executor.sampling_metadata import (
        SamplingRow,
        build_sampling_metadata,
    )

    eos = tokenizer.eos_token_id
    constraint = StructuredOutputsParams(choice=["yes"])
    # A huge bias on a token the grammar forbids must not bring it back.
    banned = tokenizer.encode("no", add_special_tokens=False)[0]
    params = SamplingParams(temperature=0.0, logit_bias={banned: 1e4},
                            structured_outputs=constraint)
    matcher = GrammarCache(info).new_matcher(constraint, eos)
    free = SamplingParams(temperature=0.0, logit_bias={banned: 1e4})
    rows = [SamplingRow(params, [5], [], None, eos, matcher),
            SamplingRow(free, [5], [], None, eos)]
    metadata = build_sampling_metadata(rows, 512, torch.device("cpu"))
    sampled = Sampler()(torch.zeros(2, 512), metadata).sampled_token_ids.tolist()
    assert tokenizer.decode([sampled[0]]) in ("y", "ye", "yes") and sampled[1] == banned


def test_a_failed_compile_is_not_cached(info, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = GrammarCache(info)
    params = StructuredOutputsParams(regex="a+")
    calls = []

    def failing(grammar):
        calls.append(grammar)
        raise RuntimeError("out of memory")

    monkeypatch.setattr(cache, "_compile", failing)
    with pytest.raises(RuntimeError, match="out of memory"):
        cache.compile(params)
    assert len(cache) == 0
    monkeypatch.undo()
    assert cache.compile(params) is not None and len(cache) == 1 and len(calls) == 1


@pytest.mark.parametrize("text,valid", [
    ('{"name": "ok", "tag": "x"}', True),
    ('{"name": "a\tb", "tag": "x"}', False),  # a raw tab: not JSON
    ('{"name": "\x01", "tag": "x"}', False),
    ('{"name": "ok", "tag": "\x1f"}', False),  # the unbounded string: xgrammar's own rule
])
def test_json_schema_strings_take_no_raw_control_characters(text: str, valid: bool) -> None:
    # xgrammar lets raw control characters into a length-bounded string; json_schema_grammar
    # closes that, so what the grammar accepts, json.loads reads.
    import xgrammar as xg

    from strand.engine_core.structured_output.grammar import json_schema_grammar
    schema = json.dumps({"type": "object", "required": ["name", "tag"], "properties": {
        "name": {"type": "string", "maxLength": 8}, "tag": {"type": "string"}}})
    vocab = [chr(i) for i in range(32, 127)] + ["\t", "\x01", "\x1f", "<eos>"]
    info = xg.TokenizerInfo(vocab, stop_token_ids=[len(vocab) - 1])
    compiled = xg.GrammarCompiler(info).compile_grammar(json_schema_grammar(schema))
    matcher = xg.GrammarMatcher(compiled)
    accepted = matcher.accept_string(text) and matcher.accept_token(len(vocab) - 1)
    assert accepted == valid
    if accepted:
        json.loads(text)
