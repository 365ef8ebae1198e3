"""Grammars from StructuredOutputsParams: syntax checks, compilation against the engine's
tokenizer (once per (kind, spec), in a bounded LRU cache) and a fresh matcher per request."""

from __future__ import annotations

import json
import logging
import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import xgrammar as xg

from strand.engine_core.processing.tokenizer import Tokenizer
from strand.engine_core.structured_output.params import CacheKey, StructuredOutputsParams

logger = logging.getLogger(__name__)

# xgrammar's errors start with "[hh:mm:ss] /path/file.cc:123: "; users need only the rest.
_ANY_OBJECT = '{"type": "object"}'
_CPP_PREFIX = re.compile(r"^\[[\d:]+\] \S+?:\d+: (Check failed: \(.*?\) is false: )?")


# xgrammar (0.2.8 and before) writes a length-bounded JSON string's characters as this class,
# which lets raw control characters (\t, \x01, ...) in: the output is then not JSON
# (json.loads refuses it). Unbounded strings use the right class; bounded ones get it here.
_LOOSE_STRING_CHAR = r'[^\"\\\r\n]'
_JSON_STRING_CHAR = r'[^\0-\x1f\"\\]'


def json_schema_grammar(schema: str, any_whitespace: bool = True) -> xg.Grammar:
    """xgrammar's grammar for a JSON schema, with no control character allowed raw in a
    string (a JSON string must escape them)."""
    grammar = xg.Grammar.from_json_schema(schema, any_whitespace=any_whitespace)
    text = str(grammar)
    if _LOOSE_STRING_CHAR not in text:
        return grammar
    return xg.Grammar.from_ebnf(text.replace(_LOOSE_STRING_CHAR, _JSON_STRING_CHAR))


def choice_grammar(choices: list[str]) -> str:
    """EBNF for one of `choices`; JSON string escaping is also valid EBNF string escaping."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


def _to_grammar(params: StructuredOutputsParams) -> xg.Grammar:
    body = _body_grammar(params)
    if params.reasoning_end is None:
        return body
    return xg.Grammar.concat(free_text_until(params.reasoning_end), body)


def free_text_until(end: str) -> xg.Grammar:
    """Any text up to and including the first `end` (xgrammar's any_text, which dispatches on
    the tag without a per-character rule): a thinking model reasons unconstrained first."""
    tag = {"type": "structural_tag", "format": {
        "type": "tag", "begin": "", "content": {"type": "any_text"}, "end": end}}
    return xg.Grammar.from_structural_tag(json.dumps(tag))


def _body_grammar(params: StructuredOutputsParams) -> xg.Grammar:
    kind = params.kind
    if kind in ("json", "json_object"):
        # json_object is vLLM's {"type": "object"}: an object, not any JSON value.
        schema = (_ANY_OBJECT if kind == "json_object" else
                  params.json if isinstance(params.json, str) else json.dumps(params.json))
        return json_schema_grammar(schema, any_whitespace=not params.disable_any_whitespace)
    if kind == "regex":
        assert params.regex is not None
        return xg.Grammar.from_regex(params.regex)
    if kind == "choice":
        assert params.choice is not None
        return xg.Grammar.from_ebnf(choice_grammar(params.choice))
    assert params.grammar is not None
    if _is_lark(params.grammar):
        return xg.Grammar.from_lark(params.grammar)
    return xg.Grammar.from_ebnf(params.grammar)


def _is_lark(grammar: str) -> bool:
    """vLLM's rule: a grammar with no `::=` outside comments is Lark (`start: ...`), not EBNF."""
    for line in grammar.splitlines():
        code = re.sub(r"(#|//).*$", "", line).strip()
        if "::=" in code:
            return False
    return True


def _clean(exc: Exception) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return _CPP_PREFIX.sub("", text)[:300]


def tokenizer_info(tokenizer: Tokenizer, vocab_size: int,
                   eos_token_id: int | None) -> xg.TokenizerInfo:
    """xgrammar's view of the vocabulary: each id's raw token string and how tokens encode
    bytes (byte-level BPE, byte fallback or raw), read from tokenizer.json.

    vocab_size is the model's: ids past the tokenizer's (padding rows) are never allowed."""
    backend = tokenizer.backend
    # "" marks a token the grammar never allows: the padding ids, and the special tokens
    # (<s>, <|user|>, ...), which detokenizing skips, so the text would not be what the grammar
    # saw. EOS still ends the grammar: it is the matcher's stop token.
    encoded: list[str] = [""] * vocab_size
    special = tokenizer.all_special_ids
    for token, token_id in backend.get_vocab(with_added_tokens=True).items():
        if 0 <= token_id < vocab_size and token_id not in special:
            encoded[token_id] = token
    metadata = xg.TokenizerInfo._detect_metadata_from_hf(backend.to_str())
    stop = [eos_token_id] if eos_token_id is not None else None
    return xg.TokenizerInfo(encoded, metadata["vocab_type"], vocab_size=vocab_size,
                            stop_token_ids=stop, add_prefix_space=metadata["add_prefix_space"])


class GrammarCache:
    """Compiled grammars keyed by StructuredOutputsParams.cache_key(), least recently used out.

    Compilation is the expensive part (it walks the vocabulary against the grammar: a quarter
    second for a small schema on a 49k vocabulary), so it runs on a thread of its own, which
    xgrammar lets run without the GIL: the engine parses a spec at add_request (cheap, and the
    error a user sees), starts its compile, and the runner waits for it only when the request
    is first sampled, after its prefill. The same spec from many requests compiles once.
    Building xgrammar's view of the vocabulary is deferred to that thread too."""

    def __init__(self, info: xg.TokenizerInfo | Callable[[], xg.TokenizerInfo],
                 max_entries: int = 256) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        self.max_entries = max_entries
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="grammar")
        make_info = info if callable(info) else (lambda: info)
        # xgrammar's own cache is off: this one is bounded by entries and keyed on our spec.
        self._compiler = self._executor.submit(
            lambda: xg.GrammarCompiler(make_info(), max_threads=1, cache_enabled=False))
        self._cache: OrderedDict[CacheKey, Future[xg.CompiledGrammar]] = \
            OrderedDict()
        self._lock = threading.Lock()
        self.num_compiled = 0  # compiles started (cache misses), for tests and stats

    def __len__(self) -> int:
        return len(self._cache)

    @staticmethod
    def parse(params: StructuredOutputsParams) -> xg.Grammar:
        """The spec as a grammar, without the vocabulary: ValueError naming the field when the
        schema, regex or grammar does not parse."""
        try:
            return _to_grammar(params)
        except (RuntimeError, ValueError, TypeError) as exc:  # xgrammar raises RuntimeError
            raise ValueError(f"structured_outputs.{params.kind} is invalid: {_clean(exc)}") \
                from None

    def compile_async(self, params: StructuredOutputsParams,
                      grammar: xg.Grammar | None = None) -> Future[xg.CompiledGrammar]:
        """The compiled grammar's future, from the cache or a compile started now (parsing
        first, so a bad spec raises ValueError here, not in the future)."""
        key = params.cache_key()
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        if grammar is None:
            grammar = self.parse(params)
        with self._lock:
            hit = self._cache.get(key)  # another thread may have started it meanwhile
            if hit is not None:
                return hit
            future = self._executor.submit(self._compile_or_forget, key, grammar)
            self.num_compiled += 1
            self._cache[key] = future
            while len(self._cache) > self.max_entries:
                self._cache.popitem(last=False)
        return future

    def compile(self, params: StructuredOutputsParams) -> xg.CompiledGrammar:
        """ValueError naming the field when the spec does not parse."""
        return self.compile_async(params).result()

    def new_matcher(self, params: StructuredOutputsParams,
                    eos_token_id: int | None) -> xg.GrammarMatcher:
        """A matcher at the start of the grammar; it ends on the request's own EOS."""
        stop = [eos_token_id] if eos_token_id is not None else None
        return xg.GrammarMatcher(self.compile(params), override_stop_tokens=stop)

    def _compile_or_forget(self, key: CacheKey,
                           grammar: xg.Grammar) -> xg.CompiledGrammar:
        try:
            return self._compile(grammar)
        except Exception as exc:
            # Rare (the spec parsed): not cached, so the next request with the spec tries
            # again. Dropped before the future completes, so no waiter sees it still cached.
            logger.error("structured_outputs.%s: compile failed: %s", key[0], exc)
            with self._lock:
                self._cache.pop(key, None)
            raise

    def _compile(self, grammar: xg.Grammar) -> xg.CompiledGrammar:
        return self._compiler.result().compile_grammar(grammar)
