"""vLLM's flags for tool_choice "auto" and for a thinking model's reasoning, on the front and on
`strand serve` alike."""

from __future__ import annotations

import argparse

from strand.engine_core.chat_config import REASONING_PARSERS
from strand.services.openai.tool_parser import PARSERS

REASONING_HELP = ("a thinking model's <think> format: deepseek_r1 (DeepSeek R1 and its "
                  "distills, QwQ) or qwen3 (Qwen 3). The reply's reasoning is answered apart "
                  "from its content, and structured outputs constrain only what follows it")


def add_tool_flags(parser: argparse.ArgumentParser, prefix: str = "") -> None:
    parser.add_argument("--enable-auto-tool-choice", action="store_true",
                        help=f"{prefix}answer tool_choice \"auto\" (OpenAI's default when tools "
                             "are given), the calls found by --tool-call-parser")
    parser.add_argument("--tool-call-parser", choices=PARSERS, default=None,
                        help=f"{prefix}the model's tool-call format: hermes (<tool_call> JSON "
                             "blocks: Hermes, Qwen 2.5, Qwen 3), llama3_json (JSON calls: "
                             "Llama 3.1, 3.2, 3.3), mistral ([TOOL_CALLS]: Mistral 7B v0.3, "
                             "Nemo, Small 3.2) or qwen3_coder (<tool_call><function=...> XML "
                             "blocks: Qwen3-Coder, Qwen 3.5)")


def check_tool_flags(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """As vLLM: the two go together; parser.error naming the missing one."""
    if args.enable_auto_tool_choice and args.tool_call_parser is None:
        parser.error("--enable-auto-tool-choice needs --tool-call-parser")
    if args.tool_call_parser is not None and not args.enable_auto_tool_choice:
        parser.error("--tool-call-parser needs --enable-auto-tool-choice")


def tool_flags(args: argparse.Namespace) -> list[str]:
    """The flags again, for the front `strand serve` starts."""
    if not args.enable_auto_tool_choice:
        return []
    return ["--enable-auto-tool-choice", "--tool-call-parser", args.tool_call_parser]


def add_usage_flag(parser: argparse.ArgumentParser, prefix: str = "") -> None:
    parser.add_argument("--enable-prompt-tokens-details", action="store_true",
                        help=f"{prefix}usage.prompt_tokens_details.cached_tokens in chat and "
                             "completion responses: the prompt tokens the prefix cache held")


def add_reasoning_flag(parser: argparse.ArgumentParser) -> None:
    """The front's own --reasoning-parser (`strand serve` has it as an engine flag, which
    holds structured outputs back until the reasoning ends, and hands it to the front)."""
    parser.add_argument("--reasoning-parser", choices=sorted(REASONING_PARSERS), default=None,
                        help=REASONING_HELP)
