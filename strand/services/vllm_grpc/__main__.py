"""`python -m strand.services.vllm_grpc --gateway-addr H:P --port 50061 --model DIR`: serves
vllm.grpc.engine.VllmEngine (the protocol of `vllm serve --grpc`, which the Shepherd Model Gateway
routes to) in front of a Strand gateway."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from strand.services.common.errors import run_main, setup_logging

DEFAULT_PORT = 50061


def main(argv: list[str] | None = None) -> None:
    setup_logging()
    run_main("strand vllm-grpc", lambda: _main(argv))


def _main(argv: list[str] | None) -> None:
    from strand.services.common.server import add_server_args
    from strand.services.common.stage_args import parse_stage_args

    parser = argparse.ArgumentParser(prog="python -m strand.services.vllm_grpc",
                                     description="vLLM's gRPC engine protocol, in front of a "
                                                 "Strand gateway")
    add_server_args(parser, DEFAULT_PORT)
    parser.add_argument("--gateway-addr", default="127.0.0.1:50051")
    parser.add_argument("--gateway-tls-cert", default=None,
                        help="the gateway's certificate (PEM), when it serves TLS")
    parser.add_argument("--model", type=Path, default=None,
                        help="the model's directory: GetTokenizer streams its tokenizer files "
                             "and GetModelInfo reads its config")
    parser.add_argument("--served-model-name", default="",
                        help="GetModelInfo's served_model_name (default: the gateway's model)")
    args, options = parse_stage_args(parser, argv)
    roots = Path(args.gateway_tls_cert).read_bytes() if args.gateway_tls_cert else None
    asyncio.run(_serve(args, options, roots))


async def _serve(args: argparse.Namespace, options: object, roots: bytes | None) -> None:
    import grpc
    from smg_grpc_proto.generated import vllm_engine_pb2, vllm_engine_pb2_grpc

    from strand.services.common.server import ServerOptions, run_server
    from strand.services.vllm_grpc.link import GatewayLink, LinkConfig
    from strand.services.vllm_grpc.servicer import VllmEngineServicer

    assert isinstance(options, ServerOptions)
    # The gateway takes the same key as this front's clients (`strand serve --api-key`).
    link = GatewayLink(LinkConfig(gateway=args.gateway_addr, model_dir=args.model,
                                  api_key=options.api_key, root_certificates=roots,
                                  served_model_name=args.served_model_name))

    def register(server: grpc.aio.Server) -> list[str]:
        vllm_engine_pb2_grpc.add_VllmEngineServicer_to_server(VllmEngineServicer(link), server)
        return [vllm_engine_pb2.DESCRIPTOR.services_by_name["VllmEngine"].full_name]

    await run_server("vllm-grpc", options, register, on_stop=link.close)


if __name__ == "__main__":
    main()
