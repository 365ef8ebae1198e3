"""`python -m strand.services.engine --model DIR [--port N] [--auto-step]`: the engine stage (loads the
model; the detokenizer subscribes to its outputs, the tokenizer and gateway send it requests)."""

from __future__ import annotations

import asyncio

import grpc

from strand.engine_core.step_driver import ADD_QUIET_S, MAX_ADD_HOLD_S
from strand.services._proto.strand.v1 import engine_pb2, engine_pb2_grpc
from strand.services.common.errors import run_main, setup_logging
from strand.services.common.server import run_server
from strand.services.common.stage_args import checked_engine_args, make_parser, parse_stage_args
from strand.services.engine.servicer import EngineServicer


def main(argv: list[str] | None = None) -> None:
    setup_logging()
    run_main("strand engine", lambda: _main(argv))


def _main(argv: list[str] | None) -> None:
    parser = make_parser("engine")
    parser.add_argument("--auto-step", action="store_true",
                        help="step while there is work, streaming each step's outputs to the "
                             "detokenizer (without it, a gateway's Step call runs each step)")
    parser.add_argument("--add-hold-ms", type=float, default=1e3 * ADD_QUIET_S,
                        help="auto mode: hold the next step until adds have paused this long, "
                             "so a burst of requests joins one step (an add to an idle engine "
                             "steps at once; 0: every add steps at once; "
                             f"at most {1e3 * MAX_ADD_HOLD_S:g}; default %(default)g)")
    parser.add_argument("--spare-core", choices=("auto", "off"), default="auto",
                        help="auto mode: after a short step that carried a request's first "
                             "token, run the next decode step on one thread fewer so the "
                             "token's way out finds a free CPU (auto: when the engine computes "
                             "on the CPU with a thread on every CPU it may use, at low load; "
                             "default %(default)s)")
    args, options = parse_stage_args(parser, argv)
    if not 0 <= args.add_hold_ms <= 1e3 * MAX_ADD_HOLD_S:
        parser.error(f"--add-hold-ms must be in [0, {1e3 * MAX_ADD_HOLD_S:g}], "
                     f"got {args.add_hold_ms:g}")
    servicer = EngineServicer.from_engine_args(checked_engine_args(args), args.auto_step,
                                               name=f"{args.host}:{args.port}",
                                               add_quiet_s=args.add_hold_ms / 1e3,
                                               spare_core=None if args.spare_core == "auto"
                                               else False)

    def register(server: grpc.aio.Server) -> list[str]:
        engine_pb2_grpc.add_EngineServicer_to_server(servicer, server)
        return [engine_pb2.DESCRIPTOR.services_by_name["Engine"].full_name]

    tasks: list[asyncio.Task[None]] = []

    async def on_started(port: int) -> None:
        loop = asyncio.get_running_loop()
        tasks.append(loop.create_task(servicer.log_stats_periodically()))
        if servicer.auto_step:
            tasks.append(loop.create_task(servicer.auto_loop()))

    async def on_stop() -> None:
        for task in tasks:
            task.cancel()
        servicer.close()

    # Not ready once a tensor-parallel rank failed: the engine can no longer step.
    asyncio.run(run_server("engine", options, register, on_stop=on_stop, on_started=on_started,
                           ready=servicer.core.is_healthy, metrics=servicer.core.metrics_registry))


if __name__ == "__main__":
    main()
