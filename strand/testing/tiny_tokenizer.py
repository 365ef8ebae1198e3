"""A tiny, seeded byte-level BPE tokenizer for tests: tokenizer.json + tokenizer_config.json.

GPT-2 style ByteLevel: every UTF-8 byte is in the base alphabet, so any text round-trips exactly and
multi-byte characters (é, 中, emoji) that training did not merge are split across several tokens,
which is what incremental detokenization has to survive.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, processors, trainers

UNK, BOS, EOS = "<unk>", "<s>", "</s>"
CHAT_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>")
SPECIAL_TOKENS = (UNK, BOS, EOS, *CHAT_TOKENS)  # ids 0, 1, 2, ... in this order
NUM_BYTES = 256
MIN_VOCAB_SIZE = NUM_BYTES + len(SPECIAL_TOKENS)
MODEL_MAX_LENGTH = 2048

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}<|system|>\n"
    "{% elif message['role'] == 'user' %}<|user|>\n"
    "{% elif message['role'] == 'assistant' %}<|assistant|>\n"
    "{% elif message['role'] == 'tool' %}<|tool|>\n"
    "{% else %}{{ raise_exception('unknown role: ' + message['role']) }}"
    "{% endif %}"
    "{{ message['content'] }}"
    "{% for call in message['tool_calls'] or [] %}"
    "<|call|>{{ call['function']['name'] }} {{ call['function']['arguments'] | tojson }}"
    "{% endfor %}<|end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

_SYLLABLES = (
    "ka", "lo", "mi", "ne", "ru", "sa", "to", "vi", "el", "an", "or", "is", "th", "qu", "ing",
    "ber", "con", "dra", "fel", "gor", "hum", "jin", "pex", "tra", "zul",
)
_EXOTIC = ("café", "naïve", "über", "中文", "中", "日本", "😀", "🚀", "€", "ß", "ñ", "Ω", "→")
_PUNCT = (".", ",", "!", "?", ";", ":", " -", "'s", "\"", "(", ")")


def write_tiny_tokenizer(out_dir: str | Path, vocab_size: int, seed: int = 0) -> None:
    """Train a deterministic tiny BPE of exactly `vocab_size` tokens and write it to `out_dir`."""
    if vocab_size < MIN_VOCAB_SIZE:
        raise ValueError(
            f"vocab_size must be >= {MIN_VOCAB_SIZE} (256 bytes + {len(SPECIAL_TOKENS)} special "
            f"tokens), got {vocab_size}"
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    tok = HFTokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(seed), trainer=trainer)
    # The bos is added by the post-processor so `tokenizers` and transformers agree on it.
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B:1", special_tokens=[(BOS, 1)]
    )
    spec = json.loads(tok.to_str())
    _pad_vocab(spec["model"]["vocab"], vocab_size)
    (out / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")

    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "unk_token": UNK,
        "add_bos_token": True,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": MODEL_MAX_LENGTH,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    special_map = {"bos_token": BOS, "eos_token": EOS, "unk_token": UNK}
    (out / "special_tokens_map.json").write_text(json.dumps(special_map, indent=2), encoding="utf-8")


def _pad_vocab(vocab: dict[str, int], vocab_size: int) -> None:
    # Training stops early when the corpus has no pair left to merge. The filler tokens have no
    # merge producing them, so encode never emits them; they decode to their (ASCII) text.
    next_id = len(vocab)
    while next_id < vocab_size:
        vocab[f"<filler{next_id}>"] = next_id
        next_id += 1


def _corpus(seed: int, num_lines: int = 3000) -> list[str]:
    rng = random.Random(seed)
    # Zipf-like word frequencies so the frequent words get merged into single tokens.
    lexicon = [_word(rng) for _ in range(600)]
    weights = [1.0 / (rank + 1) for rank in range(len(lexicon))]
    lines = []
    for _ in range(num_lines):
        parts: list[str] = []
        for _ in range(rng.randint(3, 14)):
            roll = rng.random()
            if roll < 0.06:
                parts.append(rng.choice(_EXOTIC))
            elif roll < 0.12:
                parts.append(str(rng.randint(0, 9999)))
            else:
                word = rng.choices(lexicon, weights)[0]
                parts.append(word.capitalize() if rng.random() < 0.1 else word)
            if rng.random() < 0.15:
                parts[-1] += rng.choice(_PUNCT)
        lines.append(" ".join(parts) + ("\n" if rng.random() < 0.3 else ""))
    return lines


def _word(rng: random.Random) -> str:
    return "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 4)))
