"""Command lines: loopback by default, engine flags forwarded as given, TLS files in pairs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from strand.engine_core import EngineArgs
from strand.services.cli import _engine_flags, _stack_parser, stack_config
from strand.services.common.stage_args import DEFAULT_PORTS, make_parser, parse_stage_args


@pytest.mark.parametrize("name", ["tokenizer", "engine", "detokenizer", "gateway"])
def test_every_service_binds_loopback_unless_told(name: str) -> None:
    _, options = parse_stage_args(make_parser(name, engine_flags=name != "gateway"), [])
    assert options.host == "127.0.0.1"
    assert options.port == DEFAULT_PORTS[name]


def test_host_flag_overrides_loopback() -> None:
    _, options = parse_stage_args(make_parser("engine"), ["--host", "0.0.0.0", "--port", "7"])
    assert (options.host, options.port) == ("0.0.0.0", 7)


def test_tls_cert_without_key_is_refused() -> None:
    with pytest.raises(SystemExit):
        parse_stage_args(make_parser("gateway", engine_flags=False), ["--tls-cert", "c.pem"])


def test_serve_forwards_only_the_engine_flags_that_were_changed() -> None:
    parser = _stack_parser("strand serve")
    args = parser.parse_args(["--model", "m", "--max-num-seqs", "8", "--no-enable-prefix-caching",
                              "--kv-cache-memory", "1024", "--port", "0"])
    flags = _engine_flags(args, parser)
    assert sorted(flags) == sorted(["--no-enable-prefix-caching", "--max-num-seqs", "8",
                                    "--kv-cache-memory", "1024"])
    assert flags[flags.index("--max-num-seqs") + 1] == "8"


def test_serve_forwards_nothing_by_default() -> None:
    parser = _stack_parser("strand serve")
    assert _engine_flags(parser.parse_args(["--model", "m"]), parser) == []


def test_max_pending_calls_is_a_flag_with_a_lower_bound(capsys: pytest.CaptureFixture[str]) -> None:
    parser = make_parser("gateway", engine_flags=False)
    _, options = parse_stage_args(parser, ["--max-pending-calls", "64"])
    assert options.max_pending_calls == 64
    with pytest.raises(SystemExit):
        parse_stage_args(make_parser("gateway", engine_flags=False), ["--max-pending-calls", "0"])
    assert "max_pending_calls must be >= 1, got 0" in capsys.readouterr().err


def test_serve_passes_spare_core_off_to_the_engine_stage_only_when_asked() -> None:
    parser = _stack_parser("strand serve")
    off = stack_config(parser.parse_args(["--model", "m", "--spare-core", "off"]), parser, "m")
    assert off.engine_stage_args == ["--spare-core", "off"]
    default = stack_config(parser.parse_args(["--model", "m"]), parser, "m")
    assert default.engine_stage_args == []
    with pytest.raises(SystemExit):
        parser.parse_args(["--model", "m", "--spare-core", "on"])


def test_the_engine_stage_refuses_an_unknown_spare_core_mode(
        capsys: pytest.CaptureFixture[str]) -> None:
    from strand.services.engine.__main__ import main

    with pytest.raises(SystemExit):
        main(["--spare-core", "sometimes"])
    assert "--spare-core: invalid choice: 'sometimes'" in capsys.readouterr().err


def _openai_args(argv: list[str]) -> list[str]:
    parser = _stack_parser("strand serve")
    return stack_config(parser.parse_args(argv), parser, "/cache/resolved-dir").openai_args


def test_serve_names_the_served_model_as_typed_like_vllm() -> None:
    # `--model smollm2` resolves to a cache directory; clients still say "smollm2".
    assert _openai_args(["--model", "smollm2", "--openai-port", "0"]) == [
        "--served-model-name", "smollm2"]
    assert _openai_args(["--model", "smollm2", "--openai-port", "0",
                         "--served-model-name", "a", "b"]) == ["--served-model-name", "a", "b"]
    # No --model (the tiny random model): the gateway's own name; no front: nothing.
    assert _openai_args(["--openai-port", "0"]) == []
    assert _openai_args(["--model", "smollm2"]) == []


def test_serve_hands_the_usage_flag_to_its_front() -> None:
    flag = "--enable-prompt-tokens-details"
    assert _openai_args(["--model", "m", "--openai-port", "0", flag]) == [
        "--served-model-name", "m", flag]
    with pytest.raises(ValueError, match=f"{flag} needs --openai-port"):
        _openai_args(["--model", "m", flag])


def test_serve_hands_the_tool_flags_to_its_front() -> None:
    tools = ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    assert _openai_args(["--model", "m", "--openai-port", "0", *tools]) == [
        "--served-model-name", "m", *tools]
    with pytest.raises(SystemExit):  # parser.error, as vLLM: the two go together
        _openai_args(["--model", "m", "--openai-port", "0", "--enable-auto-tool-choice"])


def test_serve_hands_the_chat_template_flags_to_the_stages(tmp_path: Path) -> None:
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    parser = _stack_parser("strand serve")
    argv = ["--model", "m", "--chat-template", str(template),
            "--default-chat-template-kwargs", '{"enable_thinking": false}']
    flags = stack_config(parser.parse_args(argv), parser, "/cache/resolved-dir").engine_args
    assert flags[flags.index("--chat-template") + 1] == str(template)
    kwargs = flags[flags.index("--default-chat-template-kwargs") + 1]
    assert json.loads(kwargs) == {"enable_thinking": False}
    with pytest.raises(SystemExit):  # not JSON: argparse's one line
        parser.parse_args(["--default-chat-template-kwargs", "{enable_thinking: false}"])


def test_serve_hands_the_reasoning_parser_to_the_engine_and_its_front() -> None:
    # One flag, as vLLM's: the engine holds structured outputs back until the reasoning ends,
    # the front answers the reasoning apart.
    parser = _stack_parser("strand serve")
    argv = ["--model", "m", "--openai-port", "0", "--reasoning-parser", "qwen3"]
    config = stack_config(parser.parse_args(argv), parser, "/cache/resolved-dir")
    assert config.openai_args[-2:] == ["--reasoning-parser", "qwen3"]
    assert "--reasoning-parser" in config.engine_args
    assert config.engine_args[config.engine_args.index("--reasoning-parser") + 1] == "qwen3"
    with pytest.raises(SystemExit):
        parser.parse_args(["--reasoning-parser", "o1"])


@pytest.mark.parametrize(("argv", "message"), [
    (["--served-model-name", "a"], "--served-model-name needs --openai-port"),
    (["--enable-auto-tool-choice", "--tool-call-parser", "hermes"],
     "--enable-auto-tool-choice needs --openai-port"),
    (["--openai-port", "0", "--served-model-name", "a", "a"],
     "--served-model-name names must be unique, got 'a' twice"),
    (["--openai-port", "0", "--served-model-name", " "],
     "--served-model-name names must be non-empty"),
    (["--openai-port", "0", "--served-model-name", "sql", "--lora-modules", "sql=/a"],
     "--served-model-name 'sql' is also a --lora-modules name"),
])
def test_bad_served_model_names_are_refused(argv: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _openai_args(["--model", "m", *argv])


def test_serve_forwards_the_speculative_config_as_json() -> None:
    parser = _stack_parser("strand serve")
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}
    argv = ["--model", "m", "--speculative-config", json.dumps(spec)]
    config = stack_config(parser.parse_args(argv), parser, "/cache/resolved-dir")
    flag = config.engine_args.index("--speculative-config")
    assert json.loads(config.engine_args[flag + 1]) == spec
    args, _ = parse_stage_args(make_parser("engine"), config.engine_args)
    assert EngineArgs.from_cli_args(args).speculative_config == spec


@pytest.mark.parametrize("stage", ["tokenizer", "engine"])
def test_serve_forwards_the_pooling_runner(stage: str) -> None:
    """The tokenizer stage refuses the wrong kind of request by it, the engine pools by it."""
    parser = _stack_parser("strand serve")
    pooler = {"pooling_type": "MEAN", "normalize": False}
    argv = ["--model", "m", "--runner", "pooling", "--pooler-config", json.dumps(pooler)]
    config = stack_config(parser.parse_args(argv), parser, "/cache/resolved-dir")
    args, _ = parse_stage_args(make_parser(stage), config.engine_args)
    engine_args = EngineArgs.from_cli_args(args)
    assert engine_args.runner == "pooling" and engine_args.pooler_config == pooler


@pytest.mark.parametrize("stage", ["tokenizer", "detokenizer", "engine"])
def test_serve_forwards_hf_overrides_to_every_stage(stage: str) -> None:
    """Every stage reads config.json with them (the tokenizer stage its limits)."""
    parser = _stack_parser("strand serve")
    overrides = {"architectures": ["Qwen3ForSequenceClassification"],
                 "classifier_from_token": ["no", "yes"], "method": "from_2_way_softmax"}
    argv = ["--model", "m", "--runner", "pooling", "--hf-overrides", json.dumps(overrides)]
    config = stack_config(parser.parse_args(argv), parser, "/cache/resolved-dir")
    args, _ = parse_stage_args(make_parser(stage), config.engine_args)
    assert EngineArgs.from_cli_args(args).hf_overrides == overrides


@pytest.mark.parametrize("value, message", [
    ("{bad", "must be a JSON object, got '{bad' (Expecting property name"),
    ("[1]", "must be a JSON object, got '[1]'"),
])
def test_a_json_flag_that_is_no_object_is_one_line_naming_it(
        value: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    parser = _stack_parser("strand serve")
    with pytest.raises(SystemExit):
        parser.parse_args(["--model", "m", "--speculative-config", value])
    assert f"argument --speculative-config: {message}" in capsys.readouterr().err


def test_serve_hands_the_shutdown_timeout_to_the_gateway_only(
        capsys: pytest.CaptureFixture[str]) -> None:
    from strand.services.launch import Stack

    parser = _stack_parser("strand serve")
    config = stack_config(parser.parse_args(["--model", "m", "--shutdown-timeout", "7.5"]),
                          parser, "m")
    assert config.shutdown_timeout == 7.5
    stack = Stack(config, {"tokenizer": 1, "engine": 2, "detokenizer": 3, "gateway": 4})
    assert stack.command("gateway")[-2:] == ["--shutdown-timeout", "7.5"]
    assert "--shutdown-timeout" not in stack.command("engine")
    default = stack_config(parser.parse_args(["--model", "m"]), parser, "m")
    assert "--shutdown-timeout" not in Stack(default, {"gateway": 4, "tokenizer": 1, "engine": 2,
                                                       "detokenizer": 3}).command("gateway")
    with pytest.raises(SystemExit):
        stack_config(parser.parse_args(["--model", "m", "--shutdown-timeout", "-1"]), parser,
                     "m")
    assert "--shutdown-timeout must be >= 0 seconds, got -1" in capsys.readouterr().err
