"""A tiny random model that thinks in DeepSeek R1's form: <think> and </think> are tokens of its
vocabulary (as in R1's and Qwen 3's), and its chat template opens the reasoning in the
generation prompt, or closes it at once with enable_thinking false (as Qwen 3's does)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import build_tiny_model

TAGS = ("<think>", "</think>")
TEMPLATE = (
    "{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}<|end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n<think>\n"
    "{% if enable_thinking is defined and enable_thinking is false %}\n</think>\n\n"
    "{% endif %}{% endif %}")


def build_thinking_model(path: Path) -> tuple[Path, dict[str, int]]:
    """The model and its tags' ids: the vocabulary's last two entries become the tags (the
    last trained merges, which no later merge builds on), added tokens the tokenizer matches
    whole and does not skip."""
    build_tiny_model(path)
    spec = json.loads((path / "tokenizer.json").read_text(encoding="utf-8"))
    vocab: dict[str, int] = spec["model"]["vocab"]
    ids: dict[str, int] = {}
    for tag, (old, token_id) in zip(TAGS, sorted(vocab.items(), key=lambda kv: kv[1])[-2:],
                                    strict=True):
        del vocab[old]
        vocab[tag] = token_id
        spec["model"]["merges"] = [m for m in spec["model"]["merges"]
                                   if "".join(m if isinstance(m, list) else m.split()) != old]
        spec["added_tokens"].append({"id": token_id, "content": tag, "single_word": False,
                                     "lstrip": False, "rstrip": False, "normalized": False,
                                     "special": False})
        ids[tag] = token_id
    (path / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    config_file = path / "tokenizer_config.json"
    config = json.loads(config_file.read_text(encoding="utf-8"))
    config["chat_template"] = TEMPLATE
    config_file.write_text(json.dumps(config), encoding="utf-8")
    return path, ids
