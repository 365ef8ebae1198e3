"""`python -m services.tokenizer --model DIR --engine-addr H:P --detokenizer-addr H:P [--port N]`:
the tokenizer stage."""

from __future__ import annotations

import asyncio

import grpc
from prometheus_client import CollectorRegistry

from engine_core.processing.input_processor import InputProcessor
from services._proto.strand.v1 import (
    detokenizer_pb2_grpc,
    engine_pb2_grpc,
    tokenizer_pb2,
    tokenizer_pb2_grpc,
)
from services.common.errors import run_main, setup_logging
from services.common.peer_health import PeerHealth
from services.common.server import ServerOptions, run_server
from services.common.stage_args import (
    checked_engine_args,
    make_parser,
    parse_stage_args,
    resolve_model_info,
)
from services.common.stage_client import StageClient
from services.tokenizer.metrics import TokenizerMetrics
from services.tokenizer.servicer import TokenizerServicer


def main(argv: list[str] | None = None) -> None:
    setup_logging()
    run_main("strand tokenizer", lambda: _main(argv))


def _main(argv: list[str] | None) -> None:
    parser = make_parser("tokenizer")
    parser.add_argument("--engine-addr", default="127.0.0.1:50053",
                        help="the engine this stage adds requests to")
    parser.add_argument("--detokenizer-addr", default="127.0.0.1:50054",
                        help="the detokenizer this stage hands request state to")
    args, options = parse_stage_args(parser, argv)
    engine_args = checked_engine_args(args)
    from engine_core.processing.tokenizer import Tokenizer

    info = resolve_model_info(engine_args)
    tokenizer = Tokenizer.from_dir(engine_args.tokenizer or info.model_dir)
    from engine_core.llm_engine import logits_processor_classes

    # The engine's limits and processors, as LLMEngine gives its own InputProcessor.
    processor = InputProcessor(tokenizer, info.max_model_len, info.vocab_size,
                               eos_token_id=tokenizer.eos_token_id,
                               max_logprobs=engine_args.max_logprobs,
                               logits_processor_classes=logits_processor_classes(engine_args))

    asyncio.run(_serve(processor, args.detokenizer_addr, args.engine_addr, options))


async def _serve(processor: InputProcessor, detokenizer_addr: str, engine_addr: str,
                 options: ServerOptions) -> None:
    detokenizer = StageClient("detokenizer", detokenizer_addr,
                              detokenizer_pb2_grpc.DetokenizerStub)
    engine = StageClient("engine", engine_addr, engine_pb2_grpc.EngineStub)
    registry = CollectorRegistry()
    servicer = TokenizerServicer(processor, detokenizer, engine, TokenizerMetrics(registry))
    peers = PeerHealth({"detokenizer": detokenizer.channel, "engine": engine.channel})

    def register(server: grpc.aio.Server) -> list[str]:
        tokenizer_pb2_grpc.add_TokenizerServicer_to_server(servicer, server)
        return [tokenizer_pb2.DESCRIPTOR.services_by_name["Tokenizer"].full_name]

    async def on_started(port: int) -> None:
        peers.start()

    async def on_stop() -> None:
        peers.stop()
        await servicer.close()

    await run_server("tokenizer", options, register, on_stop=on_stop, on_started=on_started,
                     ready=lambda: peers.ready, metrics=registry)


if __name__ == "__main__":
    main()
