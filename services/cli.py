"""`strand`: serve, demo, make-tiny-model, and each service alone (tokenizer|engine|detokenizer|gateway).

    strand serve --model DIR            # the four services on loopback; Ctrl-C stops them all
    strand demo                         # tiny model, stack, step-by-step example, shutdown
    strand engine --model DIR --port 50053   # one service alone (compose runs these)
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from engine_core.config import EngineArgs

if TYPE_CHECKING:
    from services.launch import Stack

_SERVICE_MAINS = {
    "tokenizer": "services.tokenizer.__main__",
    "engine": "services.engine.__main__",
    "detokenizer": "services.detokenizer.__main__",
    "gateway": "services.gateway.__main__",
}
# EngineArgs fields that are set by serve itself, not passed through.
_NOT_FORWARDED = {"model", "otlp_traces_endpoint"}


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = ["serve", "demo", "make-tiny-model", *_SERVICE_MAINS]
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in commands:
        print(f"usage: strand {{{','.join(commands)}}} [options]\n\n{__doc__}", file=sys.stderr)
        sys.exit(0 if argv and argv[0] in ("-h", "--help") else 2)
    command, rest = argv[0], argv[1:]
    if command in _SERVICE_MAINS:
        import importlib

        importlib.import_module(_SERVICE_MAINS[command]).main(rest)
    elif command == "serve":
        serve(rest)
    elif command == "demo":
        demo(rest)
    else:
        make_tiny_model_cmd(rest)


def _stack_parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog)
    EngineArgs.add_cli_args(parser)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=50051, help="the gateway's port")
    parser.add_argument("--auto-step", action="store_true",
                        help="the gateway steps the engine itself (Generate streams need no "
                             "Step caller)")
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--tls-cert", default=None, help="the gateway's certificate (PEM)")
    parser.add_argument("--tls-key", default=None, help="the gateway's private key (PEM)")
    parser.add_argument("--log-dir", type=Path, default=None)
    return parser


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


def _launch(args: argparse.Namespace, parser: argparse.ArgumentParser, model: str) -> Stack:
    from services.launch import StackConfig, launch_stack

    gateway_args = ["--auto-step"] if args.auto_step else []
    if args.api_key:
        gateway_args += ["--api-key", args.api_key]
    config = StackConfig(model=model, engine_args=_engine_flags(args, parser),
                         gateway_args=gateway_args, host=args.host, gateway_port=args.port,
                         otlp_traces_endpoint=args.otlp_traces_endpoint, log_dir=args.log_dir,
                         tls_cert=args.tls_cert, tls_key=args.tls_key)
    return launch_stack(config)


def serve(argv: list[str]) -> None:
    parser = _stack_parser("strand serve")
    args = parser.parse_args(argv)
    from engine_core.default_model import resolve_model_dir

    stack = _launch(args, parser, resolve_model_dir(args.model))
    print(f"strand gateway ready at {stack.gateway_address}", flush=True)
    stopping = False

    def stop(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    reported: set[str] = set()
    try:
        while not stopping:
            for name, process in stack.processes.items():
                if process.poll() is not None and name not in reported:
                    reported.add(name)
                    print(f"strand: {name} exited with code {process.returncode}",
                          file=sys.stderr)
            time.sleep(0.2)
    finally:
        stack.stop()
        print("strand: stopped", flush=True)


def demo(argv: list[str]) -> None:
    parser = _stack_parser("strand demo")
    parser.set_defaults(port=0)
    args = parser.parse_args(argv)
    from services.client import EngineClient
    from services.demo import run_seed_loop

    with tempfile.TemporaryDirectory(prefix="strand-demo-") as tmp:
        model = args.model
        if not model:
            from engine_core.model_executor.tiny_model import make_tiny_model

            model = str(make_tiny_model(Path(tmp) / "tiny-llama", num_layers=2, hidden_size=64,
                                        num_heads=4, num_kv_heads=2, vocab_size=512, seed=0))
            print(f"built a tiny random model at {model}")
        with _launch(args, parser, model) as stack:
            print(f"stack up: gateway at {stack.gateway_address}")
            roots = Path(args.tls_cert).read_bytes() if args.tls_cert else None
            with EngineClient(stack.gateway_address, api_key=args.api_key,
                              root_certificates=roots) as client:
                finished, reset_ok = run_seed_loop(client, verbose=True)
            print(f"{len(finished)} requests finished; reset at step 10 -> {reset_ok}")
    print("stack stopped")


def make_tiny_model_cmd(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="strand make-tiny-model")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--arch", default="llama")
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--num-heads", type=int, default=4)
    parser.add_argument("--num-kv-heads", type=int, default=2)
    parser.add_argument("--vocab-size", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    from engine_core.model_executor.tiny_model import make_tiny_model

    path = make_tiny_model(args.out_dir, arch=args.arch, num_layers=args.num_layers,
                           hidden_size=args.hidden_size, num_heads=args.num_heads,
                           num_kv_heads=args.num_kv_heads, vocab_size=args.vocab_size,
                           seed=args.seed)
    print(path)


if __name__ == "__main__":
    main()
