"""`python -m strand.services.detokenizer --model DIR --engine-addr H:P [--port N]`: the detokenizer stage."""

from __future__ import annotations

import asyncio

import grpc
from prometheus_client import CollectorRegistry

from strand.engine_core.metrics.request_metrics import RequestStatsRecorder
from strand.engine_core.processing.output_processor import OutputProcessor
from strand.services._proto.strand.v1 import detokenizer_pb2, detokenizer_pb2_grpc
from strand.services.common.engine_replicas import parse_engine_addresses
from strand.services.common.errors import run_main, setup_logging
from strand.services.common.server import ServerOptions, run_server
from strand.services.common.stage_args import (
    checked_engine_args,
    make_parser,
    parse_stage_args,
    resolve_model_info,
)
from strand.services.detokenizer.servicer import DetokenizerServicer


def main(argv: list[str] | None = None) -> None:
    setup_logging()
    run_main("strand detokenizer", lambda: _main(argv))


def _main(argv: list[str] | None) -> None:
    parser = make_parser("detokenizer")
    parser.add_argument("--engine-addr", default="127.0.0.1:50053",
                        help="the engine (or comma-separated engine replicas) whose step "
                             "outputs this stage subscribes to")
    args, options = parse_stage_args(parser, argv)
    try:
        engine_addrs = parse_engine_addresses(args.engine_addr)
    except ValueError as exc:
        parser.error(str(exc))
    engine_args = checked_engine_args(args)
    from strand.engine_core.default_model import resolve_model_dir
    from strand.engine_core.processing.tokenizer import Tokenizer

    # --skip-tokenizer-init: none loaded; outputs carry token ids, text "".
    tokenizer = (None if engine_args.skip_tokenizer_init else
                 Tokenizer.from_dir(engine_args.tokenizer or resolve_model_dir(engine_args.model)))
    # Each request's latencies and finish reasons are recorded here, as in LLMEngine, under
    # the model name the engine stage reports its own metrics with.
    registry = CollectorRegistry()
    info = resolve_model_info(engine_args)
    stats = RequestStatsRecorder(registry, engine_args.model or info.model_dir,
                                 info.max_model_len)
    processor = OutputProcessor(tokenizer, stream_interval=engine_args.stream_interval,
                                stats=stats)

    asyncio.run(_serve(processor, engine_addrs, options, registry))


async def _serve(processor: OutputProcessor, engine_addrs: list[str], options: ServerOptions,
                 registry: CollectorRegistry | None = None) -> None:
    # Made on the running loop: a grpc.aio channel belongs to the loop it was created on.
    servicer = DetokenizerServicer.create(processor, engine_addrs)

    def register(server: grpc.aio.Server) -> list[str]:
        detokenizer_pb2_grpc.add_DetokenizerServicer_to_server(servicer, server)
        return [detokenizer_pb2.DESCRIPTOR.services_by_name["Detokenizer"].full_name]

    async def on_started(port: int) -> None:
        servicer.start()

    async def on_stop() -> None:
        await servicer.close()

    await run_server("detokenizer", options, register, on_stop=on_stop, on_started=on_started,
                     ready=servicer.ready, metrics=registry)


if __name__ == "__main__":
    main()
