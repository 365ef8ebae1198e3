"""`python -m services.gateway --tokenizer-addr H:P --engine-addr H:P --detokenizer-addr H:P`."""

from __future__ import annotations

import asyncio

import grpc

from services._proto.strand.v1 import (
    detokenizer_pb2_grpc,
    engine_pb2_grpc,
    gateway_pb2,
    gateway_pb2_grpc,
    tokenizer_pb2_grpc,
)
from services.common.errors import run_main, setup_logging
from services.common.server import ServerOptions, run_server
from services.common.stage_args import make_parser, parse_stage_args
from services.gateway.flow import SELF_STEP_AFTER_S, GatewayFlow
from services.gateway.servicer import GatewayServicer
from services.gateway.stage_client import StageClient


def main(argv: list[str] | None = None) -> None:
    setup_logging()
    run_main("strand gateway", lambda: _main(argv))


def _main(argv: list[str] | None) -> None:
    parser = make_parser("gateway", engine_flags=False)
    parser.add_argument("--tokenizer-addr", default="127.0.0.1:50052")
    parser.add_argument("--engine-addr", default="127.0.0.1:50053")
    parser.add_argument("--detokenizer-addr", default="127.0.0.1:50054")
    parser.add_argument("--auto-step", action="store_true",
                        help="step the engine while it has work (several steps a call while "
                             "every request is FINAL_ONLY); Step returns what was produced")
    parser.add_argument("--self-step-after", type=float, default=SELF_STEP_AFTER_S,
                        help="without --auto-step: Generate streams step the engine themselves "
                             "once no Step call has come for this many seconds "
                             "(default: %(default)s)")
    parser.set_defaults(max_message_bytes=64 * 1024**2)
    args, options = parse_stage_args(parser, argv)
    if not args.self_step_after > 0:
        parser.error(f"--self-step-after must be > 0 seconds, got {args.self_step_after}")
    asyncio.run(serve(args.tokenizer_addr, args.engine_addr, args.detokenizer_addr,
                      args.auto_step, options, args.self_step_after))


async def serve(tokenizer_addr: str, engine_addr: str, detokenizer_addr: str, auto_step: bool,
                options: ServerOptions, self_step_after: float = SELF_STEP_AFTER_S) -> None:
    flow = GatewayFlow(
        StageClient("tokenizer", tokenizer_addr, tokenizer_pb2_grpc.TokenizerStub),
        StageClient("engine", engine_addr, engine_pb2_grpc.EngineStub),
        StageClient("detokenizer", detokenizer_addr, detokenizer_pb2_grpc.DetokenizerStub),
        auto_step=auto_step, self_step_after=self_step_after)

    def register(server: grpc.aio.Server) -> list[str]:
        gateway_pb2_grpc.add_GatewayServicer_to_server(GatewayServicer(flow), server)
        return [gateway_pb2.DESCRIPTOR.services_by_name["Gateway"].full_name]

    async def on_started(port: int) -> None:
        flow.start()

    await run_server("gateway", options, register, on_stop=flow.close, on_started=on_started)


if __name__ == "__main__":
    main()
