"""`python -m services.tokenizer --model DIR [--port N]`: the tokenizer stage alone."""

from __future__ import annotations

import asyncio

import grpc

from services._proto.strand.v1 import tokenizer_pb2, tokenizer_pb2_grpc
from services.common.errors import run_main, setup_logging
from services.common.server import run_server
from services.common.stage_args import (
    checked_engine_args,
    make_parser,
    parse_stage_args,
    resolve_model_info,
)
from services.tokenizer.servicer import TokenizerServicer


def main(argv: list[str] | None = None) -> None:
    setup_logging()
    run_main("strand tokenizer", lambda: _main(argv))


def _main(argv: list[str] | None) -> None:
    args, options = parse_stage_args(make_parser("tokenizer"), argv)
    engine_args = checked_engine_args(args)
    from engine_core.processing.input_processor import InputProcessor
    from engine_core.processing.tokenizer import Tokenizer

    info = resolve_model_info(engine_args)
    tokenizer = Tokenizer.from_dir(engine_args.tokenizer or info.model_dir)
    from engine_core.llm_engine import logits_processor_classes

    # The engine's limits and processors, as LLMEngine gives its own InputProcessor.
    processor = InputProcessor(tokenizer, info.max_model_len, info.vocab_size,
                               eos_token_id=tokenizer.eos_token_id,
                               max_logprobs=engine_args.max_logprobs,
                               logits_processor_classes=logits_processor_classes(engine_args))

    def register(server: grpc.aio.Server) -> list[str]:
        tokenizer_pb2_grpc.add_TokenizerServicer_to_server(TokenizerServicer(processor), server)
        return [tokenizer_pb2.DESCRIPTOR.services_by_name["Tokenizer"].full_name]

    asyncio.run(run_server("tokenizer", options, register))


if __name__ == "__main__":
    main()
