"""`python -m strand.services.tokenizer --model DIR --engine-addr H:P --detokenizer-addr H:P [--port N]`:
the tokenizer stage."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import grpc
from prometheus_client import CollectorRegistry

from strand.engine_core.config_checks import logits_processor_classes
from strand.engine_core.processing.input_processor import InputProcessor
from strand.services._proto.strand.v1 import (
    detokenizer_pb2_grpc,
    tokenizer_pb2,
    tokenizer_pb2_grpc,
)
from strand.services.common.engine_replicas import EngineReplicas, parse_engine_addresses
from strand.services.common.errors import run_main, setup_logging
from strand.services.common.peer_health import PeerHealth
from strand.services.common.server import ServerOptions, run_server
from strand.services.common.stage_args import (
    checked_engine_args,
    make_parser,
    parse_stage_args,
    resolve_model_info,
)
from strand.services.common.stage_client import StageClient
from strand.services.router.router import POLICIES
from strand.services.tokenizer.metrics import TokenizerMetrics
from strand.services.tokenizer.routing import ReplicaRouter
from strand.services.tokenizer.servicer import TokenizerServicer


def main(argv: list[str] | None = None) -> None:
    setup_logging()
    run_main("strand tokenizer", lambda: _main(argv))


def _main(argv: list[str] | None) -> None:
    parser = make_parser("tokenizer")
    parser.add_argument("--engine-addr", default="127.0.0.1:50053",
                        help="the engine this stage adds requests to, or comma-separated "
                             "engine replicas (data parallelism) to route among")
    parser.add_argument("--router-policy", choices=POLICIES, default=None,
                        help="how to pick a replica: kv-aware (cached prefix against load; the "
                             "default with several replicas, which then need --kv-events), "
                             "least-load or round-robin")
    parser.add_argument("--detokenizer-addr", default="127.0.0.1:50054",
                        help="the detokenizer this stage hands request state to")
    args, options = parse_stage_args(parser, argv)
    try:
        engine_addrs = parse_engine_addresses(args.engine_addr)
    except ValueError as exc:
        parser.error(str(exc))
    engine_args = checked_engine_args(args)
    from strand.engine_core.processing.tokenizer import Tokenizer

    info = resolve_model_info(engine_args)
    # --skip-tokenizer-init: none loaded; token-id prompts only, EOS from config.json.
    tokenizer = (None if engine_args.skip_tokenizer_init
                 else Tokenizer.from_dir(engine_args.tokenizer or info.model_dir,
                                         chat_template=engine_args.chat_template))
    # The engine's limits and processors, as LLMEngine gives its own InputProcessor.
    processor = InputProcessor(tokenizer, info.max_model_len, info.vocab_size,
                               eos_token_id=(info.eos_token_id if tokenizer is None
                                             else tokenizer.eos_token_id),
                               max_logprobs=engine_args.max_logprobs,
                               logits_processor_classes=logits_processor_classes(engine_args),
                               reasoning_parser=engine_args.reasoning_parser,
                               default_template_kwargs=engine_args.default_chat_template_kwargs,
                               priority_scheduling=engine_args.scheduling_policy == "priority",
                               runner=engine_args.runner)

    route = RouteConfig(engine_addrs, engine_args.block_size, args.router_policy,
                        engine_args.prefix_caching_hash_algo)
    asyncio.run(_serve(processor, args.detokenizer_addr, route, options))


@dataclass(slots=True)
class RouteConfig:
    engine_addrs: list[str]
    block_size: int  # the engines' own: the router hashes prompts as their caches do
    policy: str | None
    hash_algo: str


async def _serve(processor: InputProcessor, detokenizer_addr: str, route: RouteConfig,
                 options: ServerOptions) -> None:
    detokenizer = StageClient("detokenizer", detokenizer_addr,
                              detokenizer_pb2_grpc.DetokenizerStub)
    engines = EngineReplicas.connect(route.engine_addrs)
    router = ReplicaRouter(engines, route.block_size, route.policy, route.hash_algo)
    registry = CollectorRegistry()
    servicer = TokenizerServicer(processor, detokenizer, engines, router,
                                 TokenizerMetrics(registry))
    peers = PeerHealth({"detokenizer": detokenizer.channel})

    def register(server: grpc.aio.Server) -> list[str]:
        tokenizer_pb2_grpc.add_TokenizerServicer_to_server(servicer, server)
        return [tokenizer_pb2.DESCRIPTOR.services_by_name["Tokenizer"].full_name]

    async def on_started(port: int) -> None:
        peers.start()
        engines.start()
        router.start()

    def on_stopping() -> None:  # the stages stopping beside it (`strand serve`) are no news
        peers.stop()
        engines.stop_watching()

    async def on_stop() -> None:
        await servicer.close()

    await run_server("tokenizer", options, register, on_stop=on_stop, on_started=on_started,
                     ready=lambda: peers.ready and engines.ready, metrics=registry,
                     on_stopping=on_stopping)


if __name__ == "__main__":
    main()
