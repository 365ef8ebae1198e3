"""Chat templates rendered in a sandboxed, immutable jinja2 environment (as transformers does)."""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any, NoReturn

import jinja2
from jinja2.exceptions import SecurityError, TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from strand.engine_core.chat_config import chat_template_source


class _StrictSandbox(ImmutableSandboxedEnvironment):
    # jinja2's sandbox answers an unsafe attribute (`__class__`, ...) with an Undefined that prints
    # as "": a template probing for an escape would render silently. Refuse it outright instead.
    def unsafe_undefined(self, obj: Any, attribute: str) -> NoReturn:
        raise SecurityError(
            f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe"
        )


def _raise_exception(message: str) -> NoReturn:
    raise TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # transformers' filter, not jinja2's: jinja2's escapes <, >, & and ' for HTML, so a tool
    # spec or a call's arguments would read differently from the text the model was trained on.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


@lru_cache(maxsize=16)
def _compile(source: str) -> jinja2.Template:
    # trim_blocks/lstrip_blocks match transformers, so a template renders the same text in both.
    env = _StrictSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.filters["tojson"] = _tojson
    return env.from_string(source)


def render_chat_template(
    template: str,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool = True,
    special_tokens: dict[str, str] | None = None,
    tools: list[dict[str, Any]] | None = None,
    template_kwargs: dict[str, Any] | None = None,
    continue_final_message: bool = False,
) -> str:
    """Render `messages` (and `tools`, for a template that lists them, as transformers passes
    them; template_kwargs, vLLM's chat_template_kwargs, as more variables, checked by the
    caller); ValueError naming chat_template for a broken or unsafe template.

    continue_final_message: the text ends inside the last message, which the model continues
    (a reply prefilled by the client), as transformers and vLLM cut it."""
    if continue_final_message and add_generation_prompt:
        raise ValueError("continue_final_message and add_generation_prompt cannot both be true "
                         "(the one continues the last message, the other opens a new one)")
    text = _render(template, messages, add_generation_prompt, special_tokens, tools,
                   template_kwargs)
    if not continue_final_message:
        return text
    return _cut_after_final_message(text, messages[-1].get("content") if messages else None)


def _cut_after_final_message(text: str, final: object) -> str:
    """The text up to the end of the last message's content: what the template writes after
    it (an end-of-turn token) goes. The content may have lost its edges' whitespace to the
    template, so it is found stripped."""
    if not isinstance(final, str) or not final.strip():
        raise ValueError("continue_final_message needs a last message with text to continue")
    at = text.rfind(final.strip())
    if at < 0:
        raise ValueError("continue_final_message: the chat template does not write the last "
                         "message's text as it is, so there is no place to continue it")
    kept = final.lstrip()
    if text.startswith(kept, at):  # the template kept its trailing whitespace too
        return text[:at + len(kept)]
    return text[:at + len(final.strip())]


def _render(template: str, messages: list[dict[str, Any]], add_generation_prompt: bool,
            special_tokens: dict[str, str] | None, tools: list[dict[str, Any]] | None,
            template_kwargs: dict[str, Any] | None) -> str:
    try:
        compiled = _compile(template)
        return compiled.render(
            **(template_kwargs or {}),
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            tools=tools,
            **(special_tokens or {}),
        )
    except SecurityError as exc:
        raise ValueError(f"chat_template refused by the sandbox: {exc}") from exc
    except TemplateError as exc:
        raise ValueError(f"chat_template failed to render: {exc}") from exc


def load_chat_template(value: str) -> str:
    """vLLM's --chat-template: a file's template, or the template itself as given; ValueError
    naming chat_template for neither, or for a template that does not parse."""
    template = chat_template_source(value)
    try:
        _compile(template)
    except TemplateError as exc:
        raise ValueError(f"chat_template does not parse: {exc}") from None
    return template
