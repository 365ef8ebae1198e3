"""`python -m strand.services.gateway --tokenizer-addr H:P --engine-addr H:P --detokenizer-addr H:P`."""

from __future__ import annotations

import asyncio
import logging

import grpc
from prometheus_client import CollectorRegistry

from strand.engine_core.step_driver import SELF_STEP_AFTER_S
from strand.services._proto.strand.v1 import (
    control_pb2,
    control_pb2_grpc,
    detokenizer_pb2_grpc,
    gateway_pb2,
    gateway_pb2_grpc,
    inference_pb2,
    inference_pb2_grpc,
    tokenizer_pb2_grpc,
)
from strand.services.common.engine_replicas import EngineReplicas, parse_engine_addresses
from strand.services.common.errors import run_main, setup_logging
from strand.services.common.peer_health import PeerHealth
from strand.services.common.server import ServerOptions, run_server
from strand.services.common.stage_args import make_parser, parse_stage_args
from strand.services.common.stage_client import StageClient
from strand.services.common.status import StageError
from strand.services.gateway.clients import DEFAULT_MAX_PENDING_BYTES
from strand.services.gateway.drain import drain
from strand.services.gateway.flow import GatewayFlow
from strand.services.gateway.metrics import GatewayMetrics
from strand.services.gateway.servicer import GatewayServicer

logger = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> None:
    setup_logging()
    run_main("strand gateway", lambda: _main(argv))


def _main(argv: list[str] | None) -> None:
    parser = make_parser("gateway", engine_flags=False)
    parser.add_argument("--tokenizer-addr", default="127.0.0.1:50052")
    parser.add_argument("--engine-addr", default="127.0.0.1:50053",
                        help="the engine, or comma-separated engine replicas (Step, reset and "
                             "the other engine-wide calls reach every one)")
    parser.add_argument("--detokenizer-addr", default="127.0.0.1:50054")
    parser.add_argument("--auto-step", action="store_true",
                        help="expect an engine that steps itself (its own --auto-step decides "
                             "the mode; a mismatch is logged)")
    parser.add_argument("--self-step-after", type=float, default=SELF_STEP_AFTER_S,
                        help="without --auto-step: Generate streams step the engine themselves "
                             "once no Step call has come for this many seconds "
                             "(default: %(default)s)")
    parser.add_argument("--max-pending-step-bytes", type=int, default=DEFAULT_MAX_PENDING_BYTES,
                        help="per client, the outputs that may wait for its next Step; beyond "
                             "it the client's AddRequest requests end with finish_reason "
                             "\"error\" and its adds get RESOURCE_EXHAUSTED until it calls Step "
                             "(default: %(default)s)")
    parser.add_argument("--shutdown-timeout", type=float, default=0.0,
                        help="on SIGTERM, seconds the requests in flight get to finish (new "
                             "ones are refused, readiness is NOT_SERVING); those left then end "
                             "with finish_reason \"abort\" (default: %(default)s)")
    parser.set_defaults(max_message_bytes=64 * 1024**2)
    args, options = parse_stage_args(parser, argv)
    if not args.shutdown_timeout >= 0:
        parser.error(f"--shutdown-timeout must be >= 0 seconds, got {args.shutdown_timeout}")
    if not args.self_step_after > 0:
        parser.error(f"--self-step-after must be > 0 seconds, got {args.self_step_after}")
    if args.max_pending_step_bytes < 1024:
        parser.error(f"--max-pending-step-bytes must be >= 1024, got "
                     f"{args.max_pending_step_bytes}")
    if options.max_message_bytes < 1024:
        parser.error(f"--max-message-bytes must be >= 1024, got {options.max_message_bytes}")
    try:
        engine_addrs = parse_engine_addresses(args.engine_addr)
    except ValueError as exc:
        parser.error(str(exc))
    asyncio.run(serve(args.tokenizer_addr, engine_addrs, args.detokenizer_addr,
                      args.auto_step, options, args.self_step_after,
                      args.max_pending_step_bytes, args.shutdown_timeout))


async def serve(tokenizer_addr: str, engine_addrs: list[str], detokenizer_addr: str,
                auto_step: bool, options: ServerOptions,
                self_step_after: float = SELF_STEP_AFTER_S,
                max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
                shutdown_timeout: float = 0.0) -> None:
    tokenizer = StageClient("tokenizer", tokenizer_addr, tokenizer_pb2_grpc.TokenizerStub)
    engines = EngineReplicas.connect(engine_addrs)
    detokenizer = StageClient("detokenizer", detokenizer_addr,
                              detokenizer_pb2_grpc.DetokenizerStub)
    flow = GatewayFlow(tokenizer, engines, detokenizer, self_step_after=self_step_after,
                       max_step_page_bytes=options.max_message_bytes,
                       max_pending_bytes=max_pending_bytes)
    registry = CollectorRegistry()
    flow.metrics = GatewayMetrics(registry, lambda: flow.num_live)
    peers = PeerHealth({"tokenizer": tokenizer.channel, "detokenizer": detokenizer.channel})

    def register(server: grpc.aio.Server) -> list[str]:
        servicer = GatewayServicer(flow, authenticated=options.api_key is not None)
        inference_pb2_grpc.add_InferenceServicer_to_server(servicer, server)
        control_pb2_grpc.add_ControlServicer_to_server(servicer, server)
        gateway_pb2_grpc.add_GatewayServicer_to_server(servicer, server)
        return [inference_pb2.DESCRIPTOR.services_by_name["Inference"].full_name,
                control_pb2.DESCRIPTOR.services_by_name["Control"].full_name,
                gateway_pb2.DESCRIPTOR.services_by_name["Gateway"].full_name]

    async def on_started(port: int) -> None:
        flow.start()
        peers.start()
        engines.start()
        asyncio.get_running_loop().create_task(_check_mode(flow, auto_step))

    def on_stopping() -> None:  # the stages stopping beside it (`strand serve`) are no news
        peers.stop()
        engines.stop_watching()

    async def on_stop() -> None:
        await flow.close()

    await run_server("gateway", options, register, on_stop=on_stop, on_started=on_started,
                     ready=lambda: peers.ready and engines.ready and flow.feed.subscribed,
                     metrics=registry, on_stopping=on_stopping,
                     drain=lambda cut_short: drain(flow, shutdown_timeout, cut_short))


async def _check_mode(flow: GatewayFlow, auto_step: bool) -> None:
    """Learn the engine's mode once it answers; say so when --auto-step disagrees with it."""
    while flow.auto_step is None:
        try:
            await flow.engine_info()
        except StageError:
            await asyncio.sleep(0.5)
    if auto_step and not flow.auto_step:
        logger.warning("--auto-step given, but the engine at %s does not step itself: start "
                       "the engine with --auto-step", ",".join(flow.engines.names))


if __name__ == "__main__":
    main()
