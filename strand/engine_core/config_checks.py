"""Checks of EngineArgs that need feature code, which config.py (plain data) must not import.

EngineArgs checks every field it can by itself when it is built; what needs a feature runs here,
where EngineArgs becomes an engine (LLMEngine.from_engine_args) and where the CLI and the stages
parse their flags, before a model loads or a stage starts. Errors name the field, as
EngineArgs' own do.
"""

from __future__ import annotations

from strand.engine_core.config import EngineArgs
from strand.engine_core.processing.chat_template import load_chat_template


def logits_processor_classes(args: EngineArgs) -> list[type]:
    """The classes --logits-processors names (the tokenizer stage validates with them too);
    ValueError naming logits_processors for one that does not load. Imported only when some
    are named, so that stage loads no torch otherwise."""
    if not args.logits_processors:
        return []
    from strand.engine_core.model_executor.sampling.logits_processor import (
        resolve_logits_processor,
    )

    return [resolve_logits_processor(name) for name in args.logits_processors]


def check_engine_args(args: EngineArgs) -> None:
    """ValueError naming the field: a chat_template that does not parse (jinja2)."""
    if args.chat_template is not None:
        load_chat_template(args.chat_template)
