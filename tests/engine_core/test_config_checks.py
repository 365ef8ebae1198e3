"""The EngineArgs checks that need a feature run where flags are parsed and the engine is built."""

from __future__ import annotations

import pytest

from strand.engine_core.config import EngineArgs
from strand.engine_core.config_checks import check_engine_args, logits_processor_classes

BROKEN = "{% for m in messages %}"  # a template, but one that does not parse


def test_engine_args_take_a_template_that_looks_like_one() -> None:
    assert EngineArgs(chat_template=BROKEN).chat_template == BROKEN


def test_a_template_that_does_not_parse_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="chat_template does not parse"):
        check_engine_args(EngineArgs(chat_template=BROKEN))


def test_the_engine_refuses_it_before_loading_a_model() -> None:
    from strand.engine_core.llm_engine import LLMEngine

    with pytest.raises(ValueError, match="chat_template does not parse"):
        LLMEngine.from_engine_args(EngineArgs(model="/no/such/model", chat_template=BROKEN))


def test_logits_processors_load_only_when_named() -> None:
    assert logits_processor_classes(EngineArgs()) == []
    with pytest.raises(ValueError, match="logits_processors: cannot load 'no_such_module:X'"):
        logits_processor_classes(EngineArgs(logits_processors=["no_such_module:X"]))


def test_strand_serve_refuses_it_before_any_stage_starts() -> None:
    from strand.services.cli import _parse_stack_args, _stack_parser
    from strand.services.common.errors import UserError

    with pytest.raises(UserError, match="chat_template does not parse"):
        _parse_stack_args(_stack_parser("strand serve"), ["--chat-template", BROKEN])
