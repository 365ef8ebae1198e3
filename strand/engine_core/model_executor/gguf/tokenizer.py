"""A GGUF file's vocabulary as a `tokenizers` tokenizer, the way transformers rebuilds it
(transformers/integrations/gguf/gguf_tokenizer_mapping.py, the oracle of the tests)."""

from __future__ import annotations

from typing import Any

# tokenizer.ggml.token_type values (llama.cpp's llama_token_type)
UNKNOWN, CONTROL, USER_DEFINED = 2, 3, 4
SPIECE_UNDERLINE = "\u2581"


def _strings(reader: Any, key: str) -> list[str]:
    f = reader.fields[key]
    return [bytes(f.parts[i]).decode("utf-8") for i in f.data]


def _numbers(reader: Any, key: str) -> list[Any]:
    f = reader.fields[key]
    return [f.parts[i][0].item() for i in f.data]


def build_tokenizer(reader: Any, metadata: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """(tokenizers.Tokenizer, tokenizer_config.json dict). GPT-2-style byte-level BPE vocabularies
    (tokenizer.ggml.model "gpt2": Llama 3, Qwen, SmolLM, ...) and SentencePiece ones ("llama":
    Llama 2, Mistral, TinyLlama, ...: pieces with scores and token types) are rebuilt."""
    kind = metadata.get("tokenizer.ggml.model")
    if kind not in ("gpt2", "llama"):
        raise ValueError(f"GGUF tokenizer.ggml.model {kind!r} is not supported (gpt2 and llama "
                         f"are); pass --tokenizer with a HF tokenizer directory")
    tokens = _strings(reader, "tokenizer.ggml.tokens")
    types = (_numbers(reader, "tokenizer.ggml.token_type")
             if "tokenizer.ggml.token_type" in reader.fields else [1] * len(tokens))
    merges = None
    if "tokenizer.ggml.merges" in reader.fields:
        merges = [tuple(m.split(" ", 1)) for m in _strings(reader, "tokenizer.ggml.merges")]
    if kind == "gpt2":
        tok = _byte_level(tokens, types, merges or [])
    else:
        scores = (_numbers(reader, "tokenizer.ggml.scores")
                  if "tokenizer.ggml.scores" in reader.fields else None)
        tok = _sentencepiece(tokens, types, merges, scores,
                             metadata.get("tokenizer.ggml.unknown_token_id"))

    def name(key: str) -> str | None:
        i = metadata.get(key)
        return tokens[int(i)] if i is not None and 0 <= int(i) < len(tokens) else None

    config: dict[str, Any] = {"bos_token": name("tokenizer.ggml.bos_token_id"),
                              "eos_token": name("tokenizer.ggml.eos_token_id"),
                              "unk_token": name("tokenizer.ggml.unknown_token_id"),
                              "pad_token": name("tokenizer.ggml.padding_token_id")}
    if kind == "llama":
        # As transformers (and llama.cpp) do: a SentencePiece vocabulary adds BOS unless the file
        # says not to. For byte-level ones transformers adds none (chat templates write their own).
        config["add_bos_token"] = bool(metadata.get("tokenizer.ggml.add_bos_token", True))
    if metadata.get("tokenizer.chat_template"):
        config["chat_template"] = metadata["tokenizer.chat_template"]
    return tok, config


def _byte_level(tokens: list[str], types: list[int], merges: list[tuple[str, ...]]) -> Any:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)},
                               [(m[0], m[1]) for m in merges], fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types, strict=True)
                            if ty in (CONTROL, USER_DEFINED)])
    return tok


def merges_from_scores(tokens: list[str],
                       scores: list[float] | None) -> list[tuple[str, str]]:
    """The BPE merges a SentencePiece vocabulary implies (GGUF files carry pieces and scores, no
    merges): every split of a piece into two pieces of the vocabulary, the best-scored piece's
    first (transformers' generate_merges; with no scores, by id)."""
    vocab = {t: i for i, t in enumerate(tokens)}
    ranked = dict(zip(tokens, scores, strict=True)) if scores is not None else None
    order = ranked if ranked is not None else vocab
    merges: list[tuple[str, str, float]] = []
    for piece, score in order.items():
        local = [(piece[:i], piece[i:], float(score)) for i in range(1, len(piece))
                 if piece[:i] in vocab and piece[i:] in vocab]
        merges.extend(sorted(local, key=lambda m: (vocab[m[0]], vocab[m[1]])))
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=ranked is not None)
    return [(left, right) for left, right, _ in merges]


def _sentencepiece(tokens: list[str], types: list[int], merges: list[tuple[str, ...]] | None,
                   scores: list[float] | None, unk_id: int | None) -> Any:
    """SentencePiece BPE as a `tokenizers` BPE over the same pieces (transformers' LlamaTokenizer
    shape): "▁" for spaces, one prepended to the text's start, unknown characters as their
    <0xNN> byte pieces, and the decoder undoing all three."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    pairs = ([(m[0], m[1]) for m in merges] if merges is not None
             else merges_from_scores(tokens, scores))
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, pairs, fuse_unk=True,
                               byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPIECE_UNDERLINE,
                                                 prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence([decoders.Replace(SPIECE_UNDERLINE, " "),
                                     decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(content=" ", left=1)])
    special = [t for i, (t, ty) in enumerate(zip(tokens, types, strict=True))
               if ty == CONTROL or i == unk_id]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
    # User-defined pieces (like <think>) are matched whole in the text, not special.
    tok.add_tokens([AddedToken(t, special=False, normalized=False)
                    for t, ty in zip(tokens, types, strict=True) if ty == USER_DEFINED])
    return tok
