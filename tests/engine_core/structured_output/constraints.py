"""Constraints whose every completion ends within a few tokens (random weights leave all the
work to the grammar), and checks that an output satisfies each of them."""

from __future__ import annotations

import json
import re
from typing import Any

from strand.engine_core import StructuredOutputsParams

PERSON_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
        "admin": {"type": "boolean"},
    },
    "required": ["name", "age", "admin"],
    "additionalProperties": False,
}
REGEX = r"[a-z]{2,5}-\d{1,3}"
CHOICES = ["yes", "no", "maybe so", 'say "hi"']
# A tuple of one to three items, each a digit or x.
GRAMMAR = 'root ::= "(" item ("," item){0,2} ")"\nitem ::= [0-9] | "x"'
GRAMMAR_AS_REGEX = r"\((?:[0-9]|x)(?:,(?:[0-9]|x)){0,2}\)"


def constraint(kind: str) -> StructuredOutputsParams:
    if kind == "json":
        return StructuredOutputsParams(json=PERSON_SCHEMA, disable_any_whitespace=True)
    if kind == "regex":
        return StructuredOutputsParams(regex=REGEX)
    if kind == "choice":
        return StructuredOutputsParams(choice=CHOICES)
    if kind == "grammar":
        return StructuredOutputsParams(grammar=GRAMMAR)
    assert kind == "json_object"
    return StructuredOutputsParams(json_object=True)


def assert_satisfies(kind: str, text: str) -> None:
    if kind == "json":
        value = json.loads(text)
        assert set(value) == {"name", "age", "admin"}, text
        assert isinstance(value["name"], str) and 1 <= len(value["name"]) <= 6, text
        assert type(value["age"]) is int and 0 <= value["age"] <= 99, text
        assert type(value["admin"]) is bool, text
    elif kind == "regex":
        assert re.fullmatch(REGEX, text), text
    elif kind == "choice":
        assert text in CHOICES, text
    elif kind == "grammar":
        assert re.fullmatch(GRAMMAR_AS_REGEX, text), text
    else:
        assert isinstance(json.loads(text), dict), text


KINDS = ("json", "regex", "choice", "grammar", "json_object")
