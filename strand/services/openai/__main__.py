"""`python -m strand.services.openai --gateway-addr H:P --port 8000`: the OpenAI-compatible front."""

from __future__ import annotations

import argparse
from pathlib import Path

from strand.services.common.errors import run_main, setup_logging
from strand.services.openai.body_limit import DEFAULT_MAX_BODY_BYTES
from strand.services.openai.tool_flags import (
    add_reasoning_flag,
    add_tool_flags,
    add_usage_flag,
    check_tool_flags,
)


def main(argv: list[str] | None = None) -> None:
    setup_logging()
    run_main("strand openai", lambda: _main(argv))


def _main(argv: list[str] | None) -> None:
    parser = argparse.ArgumentParser(prog="python -m strand.services.openai",
                                     description="OpenAI-compatible HTTP front of a gateway")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--gateway-addr", default="127.0.0.1:50051")
    parser.add_argument("--api-key", default=None,
                        help="required of HTTP clients (Bearer) and passed to the gateway")
    parser.add_argument("--gateway-tls-cert", default=None,
                        help="the gateway's certificate (PEM), when it serves TLS")
    parser.add_argument("--served-model-name", nargs="+", default=[], metavar="NAME",
                        help="the model names clients use; the first is listed first and "
                             "answers a request that names none (default: the gateway's model)")
    parser.add_argument("--lora-modules", nargs="*", default=[], metavar="NAME=PATH",
                        help="LoRA adapters served by model name (the engine needs "
                             "--enable-lora); /v1/models lists them")
    parser.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
                        help="the largest HTTP request body taken; a larger one is a 413, "
                             "refused unread (default %(default)s)")
    parser.add_argument("--otlp-traces-endpoint", default=None,
                        help="OTLP/gRPC endpoint for this front's spans (one per HTTP request)")
    parser.add_argument("--shutdown-timeout", type=float, default=0.0,
                        help="on SIGTERM, seconds the requests in flight get to finish while "
                             "new ones get a 503 (the gateway's --shutdown-timeout)")
    add_tool_flags(parser)
    add_reasoning_flag(parser)
    add_usage_flag(parser)
    args = parser.parse_args(argv)
    if args.max_body_bytes < 1:
        parser.error(f"--max-body-bytes must be >= 1, got {args.max_body_bytes}")
    check_tool_flags(parser, args)

    import uvicorn

    from strand.services.common.tracing import init_tracing, shutdown_tracing
    from strand.services.openai.app import FrontConfig, create_app
    from strand.services.openai.drain import DrainingServer, DrainState
    from strand.services.openai.lora_modules import parse_lora_modules
    from strand.services.openai.served_names import check_served_names

    lora_modules = parse_lora_modules(args.lora_modules)
    check_served_names(args.served_model_name, lora_modules)
    roots = Path(args.gateway_tls_cert).read_bytes() if args.gateway_tls_cert else None
    drain = DrainState()
    app = create_app(FrontConfig(gateway=args.gateway_addr, api_key=args.api_key,
                                 root_certificates=roots,
                                 served_model_names=args.served_model_name,
                                 lora_modules=lora_modules,
                                 max_body_bytes=args.max_body_bytes,
                                 tool_call_parser=args.tool_call_parser,
                                 reasoning_parser=args.reasoning_parser,
                                 prompt_tokens_details=args.enable_prompt_tokens_details),
                     drain)
    init_tracing("strand-openai", args.otlp_traces_endpoint)
    try:
        # The drain waits for the requests in flight; what uvicorn's own shutdown then waits
        # for is the answers already on their way.
        config = uvicorn.Config(app, host=args.host, port=args.port, log_level="warning",
                                timeout_graceful_shutdown=3)
        DrainingServer(config, drain, args.shutdown_timeout).run()
    finally:
        shutdown_tracing()


if __name__ == "__main__":
    main()
