"""A GGUF file's vocabulary as a `tokenizers` tokenizer, the way transformers rebuilds it."""

from __future__ import annotations

from typing import Any

# tokenizer.ggml.token_type values (llama.cpp's llama_token_type)
CONTROL, USER_DEFINED = 3, 4


def _strings(reader: Any, key: str) -> list[str]:
    f = reader.fields[key]
    return [bytes(f.parts[i]).decode("utf-8") for i in f.data]


def _ints(reader: Any, key: str) -> list[int]:
    f = reader.fields[key]
    return [int(f.parts[i][0]) for i in f.data]


def build_tokenizer(reader: Any, metadata: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """(tokenizers.Tokenizer, tokenizer_config.json dict). GPT-2-style byte-level BPE vocabularies
    (tokenizer.ggml.model "gpt2": Llama 3, Qwen, SmolLM, ...) are rebuilt; SentencePiece ones
    ("llama") are not yet, and say so."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    kind = metadata.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"GGUF tokenizer.ggml.model {kind!r} is not supported yet (gpt2 is); "
                         f"pass --tokenizer with a HF tokenizer directory")
    tokens = _strings(reader, "tokenizer.ggml.tokens")
    merges: list[tuple[str, str]] = []
    for m in _strings(reader, "tokenizer.ggml.merges"):
        left, right = m.split(" ", 1)
        merges.append((left, right))
    types = (_ints(reader, "tokenizer.ggml.token_type")
             if "tokenizer.ggml.token_type" in reader.fields else [1] * len(tokens))
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges, fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types, strict=True)
                            if ty in (CONTROL, USER_DEFINED)])

    def name(key: str) -> str | None:
        i = metadata.get(key)
        return tokens[int(i)] if i is not None and 0 <= int(i) < len(tokens) else None

    config: dict[str, Any] = {"bos_token": name("tokenizer.ggml.bos_token_id"),
                              "eos_token": name("tokenizer.ggml.eos_token_id"),
                              "unk_token": name("tokenizer.ggml.unknown_token_id"),
                              "pad_token": name("tokenizer.ggml.padding_token_id")}
    # tokenizer.ggml.add_bos_token is not applied: transformers' GGUF tokenizer (the oracle) adds
    # no BOS for it, and chat templates write their own.
    if metadata.get("tokenizer.chat_template"):
        config["chat_template"] = metadata["tokenizer.chat_template"]
    return tok, config
