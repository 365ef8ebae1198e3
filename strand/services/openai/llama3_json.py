"""Llama 3.1 / 3.2 / 3.3's tool calls (`--tool-call-parser llama3_json`, vLLM's name): a reply
that calls tools is JSON objects {"name": ..., "parameters": {...}} ("arguments" is taken too),
one after another separated by ";", after an optional <|python_tag|> (a special token, which
the detokenizer usually leaves out). Anything else is text, and so is a reply that begins as a
call but does not parse as calls throughout, as vLLM's parser answers it."""

from __future__ import annotations

import json
from typing import Any

from strand.services.openai.tool_call import arguments_json, openai_call

PYTHON_TAG = "<|python_tag|>"


def _body(text: str) -> str:
    body = text.lstrip()
    if body.startswith(PYTHON_TAG):
        body = body[len(PYTHON_TAG):].lstrip()
    return body


def begins_as_call(text: str) -> bool | None:
    """Whether a reply so far begins as a call; None while that is not known yet (nothing but
    whitespace, or the start of <|python_tag|>)."""
    body = text.lstrip()
    if body.startswith(PYTHON_TAG) or body.startswith("{"):
        return True
    if not body or PYTHON_TAG.startswith(body):
        return None
    return False


def parse_llama3_json(text: str) -> tuple[str, list[dict[str, Any]]]:
    """(content, calls) of a whole reply: ("", its calls) where it is calls throughout, else
    (text, [])."""
    if not begins_as_call(text):
        return text, []
    body, decoder = _body(text), json.JSONDecoder()
    calls: list[dict[str, Any]] = []
    at = 0
    while at < len(body):
        try:
            value, at = decoder.raw_decode(body, at)
        except ValueError:
            return text, []
        if not (isinstance(value, dict) and isinstance(value.get("name"), str)
                and ("parameters" in value or "arguments" in value)):
            return text, []
        arguments = value["parameters"] if "parameters" in value else value["arguments"]
        calls.append(openai_call(value["name"], arguments_json(arguments)))
        rest = body[at:].lstrip()
        if rest.startswith(";"):
            rest = rest[1:].lstrip()
        elif rest:
            return text, []  # something after a call that is neither ";" nor the next call
        at = len(body) - len(rest)
    return "", calls
