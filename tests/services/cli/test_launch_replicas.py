"""What `strand serve --data-parallel-size` / `--engine-addresses` start and tell each stage,
without starting anything."""

from __future__ import annotations

import pytest

from strand.services.cli import _replica_args, _stack_parser
from strand.services.launch import Stack, StackConfig


def _stack(**fields: object) -> Stack:
    config = StackConfig(model="m", **fields)  # type: ignore[arg-type]
    names = ["tokenizer", *config.engine_names, "detokenizer", "gateway"]
    return Stack(config, {name: 6000 + i for i, name in enumerate(names)})


def _flag(command: list[str], flag: str) -> str:
    return next(a.split("=", 1)[1] for a in command if a.startswith(f"{flag}="))


def test_replicas_are_engine_processes_every_stage_is_told_about() -> None:
    stack = _stack(data_parallel_size=2)
    assert stack.stage_names == ["tokenizer", "engine-0", "engine-1", "detokenizer"]
    both = f"127.0.0.1:{stack.ports['engine-0']},127.0.0.1:{stack.ports['engine-1']}"
    for name in ("tokenizer", "detokenizer", "gateway"):
        assert _flag(stack.command(name), "--engine-addr") == both
    engine = stack.command("engine-1")
    assert engine[1:3] == ["-m", "strand.services.engine"]
    assert "--kv-events" in engine  # kv-aware routing (the default) reads them


def test_other_policies_leave_kv_events_off_and_reach_the_tokenizer() -> None:
    stack = _stack(data_parallel_size=2, router_policy="least-load")
    assert "--kv-events" not in stack.command("engine-0")
    tokenizer = stack.command("tokenizer")
    assert tokenizer[tokenizer.index("--router-policy") + 1] == "least-load"


def test_one_engine_keeps_its_name_and_records_no_events() -> None:
    stack = _stack()
    assert stack.config.engine_names == ["engine"]
    assert "--kv-events" not in stack.command("engine")


def test_engine_addresses_start_no_engine() -> None:
    stack = _stack(engine_addresses=["h1:50053", "h2:50053"])
    assert stack.stage_names == ["tokenizer", "detokenizer"]
    assert _flag(stack.command("gateway"), "--engine-addr") == "h1:50053,h2:50053"


@pytest.mark.parametrize(("argv", "message"), [
    (["--data-parallel-size", "0"], "--data-parallel-size must be >= 1, got 0"),
    (["--engine-addresses", "h1"], "--engine-addresses entries must be host:port"),
    (["--engine-addresses", "h1:1", "--data-parallel-size", "2"],
     "--data-parallel-size must be 1 with --engine-addresses"),
])
def test_bad_replica_flags_are_refused_naming_the_flag(
        argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    parser = _stack_parser("strand serve")
    with pytest.raises(SystemExit) as exit_:
        _replica_args(parser.parse_args(argv), parser)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_each_replica_gets_its_own_visible_gpu_when_there_is_one_per_replica() -> None:
    stack = _stack(data_parallel_size=2)
    env = {"CUDA_VISIBLE_DEVICES": "2,3,5"}
    assert stack.replica_env("engine-0", env) == {"CUDA_VISIBLE_DEVICES": "2"}
    assert stack.replica_env("engine-1", env) == {"CUDA_VISIBLE_DEVICES": "3"}
    assert stack.replica_env("tokenizer", env) == {}
    assert stack.replica_env("engine-1", {"CUDA_VISIBLE_DEVICES": "0"}) == {}  # shared
    assert stack.replica_env("engine-1", {}) == {}


def test_the_engines_own_flags_reach_every_engine_and_no_other_stage() -> None:
    stack = _stack(data_parallel_size=2, engine_stage_args=["--add-hold-ms", "0.0"],
                   gateway_args=["--auto-step"])
    for name in ("engine-0", "engine-1"):
        command = stack.command(name)
        assert command[command.index("--add-hold-ms") + 1] == "0.0"
    for name in ("tokenizer", "detokenizer", "gateway"):
        assert "--add-hold-ms" not in stack.command(name)


def test_serve_passes_add_hold_ms_to_the_engines_only_when_given() -> None:
    from strand.services.cli import stack_config
    parser = _stack_parser("strand serve")
    given = stack_config(parser.parse_args(["--model", "m", "--add-hold-ms", "0"]), parser, "m")
    assert given.engine_stage_args == ["--add-hold-ms", "0.0"]
    assert stack_config(parser.parse_args(["--model", "m"]), parser, "m").engine_stage_args == []


def test_serve_refuses_a_hold_out_of_bounds_before_starting_anything(
        capsys: pytest.CaptureFixture[str]) -> None:
    from strand.services.cli import stack_config
    parser = _stack_parser("strand serve")
    with pytest.raises(SystemExit):
        stack_config(parser.parse_args(["--model", "m", "--add-hold-ms", "51"]), parser, "m")
    assert "--add-hold-ms must be in [0, 50], got 51" in capsys.readouterr().err


class _Proc:
    """A service process that exits when signalled, recording when it was signalled and waited."""

    def __init__(self, name: str, events: list[str]) -> None:
        self.name, self.events, self.exited = name, events, False

    def poll(self) -> int | None:
        return 0 if self.exited else None

    def send_signal(self, sig: int) -> None:
        self.events.append(f"term {self.name}")
        self.exited = True

    def wait(self, timeout: float | None = None) -> int:
        self.events.append(f"gone {self.name}")
        return 0


def test_a_stop_goes_front_to_back_each_wave_gone_before_the_next() -> None:
    # Signalled together, the gateway often saw the engine go before it handled its own SIGTERM
    # and warned that the engine was out of rotation.
    stack = _stack(data_parallel_size=2)
    events: list[str] = []
    for name in ["gateway", *stack.stage_names]:
        stack.processes[name] = _Proc(name, events)  # type: ignore[assignment]
    stack.stop()
    assert events == ["term gateway", "gone gateway", "term tokenizer", "gone tokenizer",
                      "term engine-0", "term engine-1", "term detokenizer", "gone engine-0",
                      "gone engine-1", "gone detokenizer"]
