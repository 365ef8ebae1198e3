"""Tokenizer: a HF tokenizer directory (tokenizer.json + tokenizer_config.json) without transformers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as HFTokenizer

from strand.engine_core.processing.chat_template import load_chat_template, render_chat_template


class Tokenizer:
    def __init__(self, backend: HFTokenizer, config: dict[str, Any]) -> None:
        self._backend = backend
        self._config = config
        self.vocab_size: int = backend.get_vocab_size(with_added_tokens=True)
        self.bos_token: str | None = _token_content(config.get("bos_token"))
        self.eos_token: str | None = _token_content(config.get("eos_token"))
        self.unk_token: str | None = _token_content(config.get("unk_token"))
        self.bos_token_id: int | None = self._id_of(self.bos_token)
        self.eos_token_id: int | None = self._id_of(self.eos_token)
        self.unk_token_id: int | None = self._id_of(self.unk_token)
        added = backend.get_added_tokens_decoder()
        # Every added token is decoded as its own piece, like HF's slow tokenizers do.
        self.added_token_ids: dict[int, str] = {i: t.content for i, t in added.items()}
        self.all_special_ids: set[int] = {i for i, t in added.items() if t.special}
        self.all_special_ids |= {
            i for i in (self.bos_token_id, self.eos_token_id, self.unk_token_id) if i is not None
        }
        self.add_bos_token: bool | None = config.get("add_bos_token")
        self.model_max_length: int | None = config.get("model_max_length")
        self.chat_template: str | None = _pick_chat_template(config.get("chat_template"))

    @classmethod
    def from_dir(cls, path: str | Path, chat_template: str | None = None) -> Tokenizer:
        """chat_template: vLLM's --chat-template (a file or the template), replacing the
        directory's."""
        root = Path(path)
        tokenizer_file = root / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise ValueError(f"tokenizer: no tokenizer.json in {str(root)!r}")
        backend = HFTokenizer.from_file(str(tokenizer_file))
        config: dict[str, Any] = {}
        for name in ("special_tokens_map.json", "tokenizer_config.json"):
            file = root / name
            if file.is_file():
                config.update(json.loads(file.read_text(encoding="utf-8")))
        template_file = root / "chat_template.jinja"  # where transformers >= 4.50 saves it
        if not config.get("chat_template") and template_file.is_file():
            config["chat_template"] = template_file.read_text(encoding="utf-8")
        if chat_template is not None:
            config["chat_template"] = load_chat_template(chat_template)
        return cls(backend, config)

    @property
    def backend(self) -> HFTokenizer:
        """The `tokenizers` object (its vocabulary and JSON spec feed the grammar engine)."""
        return self._backend

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids: list[int] = self._backend.encode(text, add_special_tokens=add_special_tokens).ids
        if add_special_tokens and self.add_bos_token is not None and self.bos_token_id is not None:
            # tokenizer_config's add_bos_token wins over the tokenizer.json post-processor.
            has_bos = bool(ids) and ids[0] == self.bos_token_id
            if self.add_bos_token and not has_bos:
                ids = [self.bos_token_id, *ids]
            elif not self.add_bos_token and has_bos:
                ids = ids[1:]
        return ids

    def encode_pair(self, text: str, pair: str) -> list[int]:
        """A text pair as one prompt, joined by tokenizer.json's pair template (a
        cross-encoder's input, as transformers' tokenizer(text, text_pair=...) makes it)."""
        return list(self._backend.encode(text, pair, add_special_tokens=True).ids)

    def decode(
        self,
        ids: list[int],
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = False,
    ) -> str:
        """Ids unknown to the tokenizer decode to nothing (models may pad their vocab)."""
        if skip_special_tokens or not spaces_between_special_tokens:
            return str(self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens))
        # HF slow-tokenizer semantics: added tokens stand apart, joined to the text by a space.
        pieces: list[str] = []
        run: list[int] = []
        for token_id in ids:
            content = self.added_token_ids.get(token_id)
            if content is None:
                run.append(token_id)
                continue
            if run:
                pieces.append(self._backend.decode(run, skip_special_tokens=False))
                run = []
            pieces.append(content)
        if run:
            pieces.append(self._backend.decode(run, skip_special_tokens=False))
        return " ".join(pieces)

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]:
        return [self._backend.id_to_token(i) or "" for i in ids]

    def token_to_id(self, token: str) -> int | None:
        token_id = self._backend.token_to_id(token)
        return None if token_id is None else int(token_id)

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
        continue_final_message: bool = False,
    ) -> str:
        if not self.chat_template:
            raise ValueError("chat_template: the tokenizer has none, so 'messages' cannot be used")
        return render_chat_template(
            self.chat_template,
            messages,
            add_generation_prompt=add_generation_prompt,
            special_tokens={
                "bos_token": self.bos_token or "",
                "eos_token": self.eos_token or "",
                "unk_token": self.unk_token or "",
            },
            tools=tools,
            template_kwargs=template_kwargs,
            continue_final_message=continue_final_message,
        )

    def _id_of(self, token: str | None) -> int | None:
        return None if token is None else self.token_to_id(token)


def _token_content(value: object) -> str | None:
    # tokenizer_config.json stores special tokens as a string or as a serialized AddedToken.
    if isinstance(value, dict):
        content = value.get("content")
        return content if isinstance(content, str) else None
    return value if isinstance(value, str) else None


def _pick_chat_template(value: object) -> str | None:
    # Some configs carry a list of named templates; the one named "default" is the chat one.
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        value = named.get("default")
    return value if isinstance(value, str) else None
