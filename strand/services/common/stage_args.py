"""Command-line flags every stage shares: engine flags (EngineArgs) plus server flags."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from strand.engine_core.config import EngineArgs
from strand.services.common.server import ServerOptions, add_server_args, options_from_args

# Default ports when a stage runs alone (compose); `strand serve` picks free ones.
DEFAULT_PORTS = {"gateway": 50051, "tokenizer": 50052, "engine": 50053, "detokenizer": 50054}


@dataclass(slots=True)
class ModelInfo:
    model_dir: str
    max_model_len: int
    vocab_size: int
    eos_token_id: int | None  # config.json's: what a stage without a tokenizer stops on


def make_parser(name: str, engine_flags: bool = True) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=f"strand {name}", description=f"Strand {name} service")
    if engine_flags:
        EngineArgs.add_cli_args(parser)
    add_server_args(parser, DEFAULT_PORTS[name])
    return parser


def parse_stage_args(parser: argparse.ArgumentParser, argv: list[str] | None
                     ) -> tuple[argparse.Namespace, ServerOptions]:
    args = parser.parse_args(argv)
    try:
        options = options_from_args(args)
    except ValueError as exc:
        parser.error(str(exc))
    return args, options


def resolve_model_info(engine_args: EngineArgs) -> ModelInfo:
    """What the tokenizer stage must know about the model without loading its weights."""
    from strand.engine_core.default_model import resolve_model_dir
    from strand.engine_core.model_executor.model_config import config_eos_token_id, model_limits

    model_dir = resolve_model_dir(engine_args.model)
    max_positions, vocab_size = model_limits(model_dir, engine_args.hf_overrides)
    max_len = engine_args.scheduler_config(max_positions).max_model_len
    return ModelInfo(model_dir=model_dir, max_model_len=max_len, vocab_size=vocab_size,
                     eos_token_id=config_eos_token_id(model_dir))


def checked_engine_args(args: argparse.Namespace) -> EngineArgs:
    """EngineArgs from the flags, with --model checked first: a wrong path is one clear line,
    not a stage-specific error (the detokenizer's was "no tokenizer.json")."""
    from strand.engine_core.config_checks import check_engine_args
    from strand.engine_core.default_model import resolve_model_dir
    from strand.services.common.errors import check_model_dir

    engine_args = EngineArgs.from_cli_args(args)
    check_engine_args(engine_args)
    check_model_dir(resolve_model_dir(engine_args.model), engine_args.tokenizer,
                    needs_tokenizer=not engine_args.skip_tokenizer_init)
    return engine_args
