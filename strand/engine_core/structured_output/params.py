"""StructuredOutputsParams: vLLM's per-request output constraint, validated with its rules.

Exactly one kind of constraint: a JSON schema (`json`), a regular expression (`regex`), one of a
list of strings (`choice`), an EBNF or Lark grammar (`grammar`) or any JSON object
(`json_object=True`).
The structure is checked here, in plain Python (the tokenizer stage imports no grammar engine,
which would pull in torch); whether the schema, regex or grammar itself parses is checked when the
engine core compiles it in add_request, before the request is added.
"""

from __future__ import annotations

import json as jsonlib
from dataclasses import dataclass
from typing import Any

# Bounds on what one request may ask the grammar compiler to chew on: a huge schema or choice
# list would stall the stage that compiles it for everyone else.
MAX_SPEC_CHARS = 64 * 1024
MAX_CHOICES = 1024

KINDS = ("json", "regex", "choice", "grammar", "json_object")
# (kind, canonical spec, disable_any_whitespace, reasoning_end)
CacheKey = tuple[str, str, bool, str | None]


@dataclass(slots=True)
class StructuredOutputsParams:
    json: str | dict[str, Any] | None = None  # a JSON schema, as text or as a dict
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None  # EBNF (GBNF) with a `root` rule, or Lark with a `start` rule
    json_object: bool = False  # any JSON object, no schema
    # JSON kinds: no whitespace between tokens (vLLM's option; also keeps outputs short).
    disable_any_whitespace: bool = False
    # The constraint holds only after this text (a thinking model's closing tag): the input
    # processor sets it under EngineArgs.reasoning_parser, as vLLM's engine lets a model reason
    # freely before a schema binds its answer. None: from the first token.
    reasoning_end: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.choice, tuple):
            self.choice = list(self.choice)
        self.validate()

    @property
    def kind(self) -> str:
        """The one constraint kind given: "json" | "regex" | "choice" | "grammar" | "json_object"."""
        return self._given()[0]

    def validate(self) -> None:
        """ValueError naming the field; the spec's syntax is checked by compiling it."""
        given = self._given()
        if len(given) != 1:
            which = ", ".join(given) if given else "none"
            raise ValueError("structured_outputs must set exactly one of json, regex, choice, "
                             f"grammar, json_object; got {which}")
        if self.json is not None:
            if isinstance(self.json, str):
                _check_size("json", self.json)
                try:
                    schema = jsonlib.loads(self.json)
                except ValueError as exc:
                    raise ValueError(f"structured_outputs.json must be a JSON schema: {exc}") \
                        from None
            elif isinstance(self.json, dict):
                schema = self.json
                try:
                    _check_size("json", jsonlib.dumps(schema))
                except TypeError as exc:
                    raise ValueError("structured_outputs.json must be JSON-serialisable: "
                                     f"{exc}") from None
            else:
                raise ValueError("structured_outputs.json must be a str or a dict, got "
                                 f"{type(self.json).__name__}")
            if not isinstance(schema, dict | bool):
                raise ValueError("structured_outputs.json must be a JSON schema (an object), "
                                 f"got {type(schema).__name__}")
        if self.reasoning_end is not None and (not isinstance(self.reasoning_end, str)
                                               or not 0 < len(self.reasoning_end) <= 64):
            raise ValueError("structured_outputs.reasoning_end must be a str of 1 to 64 "
                             f"characters, got {self.reasoning_end!r:.80}")
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None:
                if not isinstance(value, str) or not value:
                    raise ValueError(f"structured_outputs.{name} must be a non-empty str, "
                                     f"got {value!r:.80}")
                _check_size(name, value)
        if self.choice is not None:
            if (not isinstance(self.choice, list) or not self.choice
                    or not all(isinstance(c, str) and c for c in self.choice)):
                raise ValueError("structured_outputs.choice must be a non-empty list of "
                                 f"non-empty strings, got {self.choice!r:.200}")
            if len(self.choice) > MAX_CHOICES:
                raise ValueError(f"structured_outputs.choice must have <= {MAX_CHOICES} "
                                 f"entries, got {len(self.choice)}")
            _check_size("choice", "".join(self.choice))

    def cache_key(self) -> CacheKey:
        """(kind, canonical spec, options): equal keys compile to the same grammar."""
        kind = self.kind
        if kind == "json":
            schema = jsonlib.loads(self.json) if isinstance(self.json, str) else self.json
            spec = jsonlib.dumps(schema, sort_keys=True, separators=(",", ":"))
        elif kind == "choice":
            spec = jsonlib.dumps(self.choice, ensure_ascii=False)
        elif kind == "json_object":
            spec = ""
        else:
            spec = str(getattr(self, kind))
        return kind, spec, self.disable_any_whitespace, self.reasoning_end

    def _given(self) -> list[str]:
        given = [name for name in ("json", "regex", "choice", "grammar")
                 if getattr(self, name) is not None]
        if self.json_object:
            given.append("json_object")
        return given

    def to_dict(self) -> dict[str, Any]:
        """The set fields only (the kind and the options that differ from their defaults)."""
        out: dict[str, Any] = {self.kind: getattr(self, self.kind)}
        if self.disable_any_whitespace:
            out["disable_any_whitespace"] = True
        if self.reasoning_end is not None:
            out["reasoning_end"] = self.reasoning_end
        return out


def _check_size(name: str, text: str) -> None:
    if len(text) > MAX_SPEC_CHARS:
        raise ValueError(f"structured_outputs.{name} must be at most {MAX_SPEC_CHARS} "
                         f"characters, got {len(text)}")
