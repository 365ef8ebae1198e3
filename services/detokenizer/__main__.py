"""`python -m services.detokenizer --model DIR [--port N]`: the detokenizer stage alone."""

from __future__ import annotations

import asyncio

import grpc

from services._proto.strand.v1 import detokenizer_pb2, detokenizer_pb2_grpc
from services.common.errors import run_main, setup_logging
from services.common.server import run_server
from services.common.stage_args import checked_engine_args, make_parser, parse_stage_args
from services.detokenizer.servicer import DetokenizerServicer


def main(argv: list[str] | None = None) -> None:
    setup_logging()
    run_main("strand detokenizer", lambda: _main(argv))


def _main(argv: list[str] | None) -> None:
    args, options = parse_stage_args(make_parser("detokenizer"), argv)
    engine_args = checked_engine_args(args)
    from engine_core.default_model import resolve_model_dir
    from engine_core.processing.output_processor import OutputProcessor
    from engine_core.processing.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_dir(engine_args.tokenizer or resolve_model_dir(engine_args.model))
    processor = OutputProcessor(tokenizer, stream_interval=engine_args.stream_interval)

    def register(server: grpc.aio.Server) -> list[str]:
        detokenizer_pb2_grpc.add_DetokenizerServicer_to_server(DetokenizerServicer(processor),
                                                               server)
        return [detokenizer_pb2.DESCRIPTOR.services_by_name["Detokenizer"].full_name]

    asyncio.run(run_server("detokenizer", options, register))


if __name__ == "__main__":
    main()
