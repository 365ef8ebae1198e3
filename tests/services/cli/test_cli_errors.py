"""A user's mistake ends in one clear line on stderr and exit code 1; --debug adds the traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from strand.services import cli
from strand.services.client import EngineClient, ServerUnavailable, translate
from strand.services.common.errors import UserError, check_model_dir
from strand.services.launch import REPO_ROOT, free_port
from strand.testing.tiny_model import ARCHITECTURES

ENV = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
ENV.pop("STRAND_LOG_LEVEL", None)


def _strand(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "strand.services.cli", *args], capture_output=True,
                          text=True, env=env or ENV, cwd=REPO_ROOT, timeout=120)


@pytest.fixture
def strand_here(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
                ) -> Callable[..., subprocess.CompletedProcess[str]]:
    """`strand ARGS` run in this process (a subprocess per case costs seconds of imports)."""
    monkeypatch.delenv("STRAND_LOG_LEVEL", raising=False)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        capsys.readouterr()
        code: int | str | None = 0
        try:
            cli.main(list(args))
        except SystemExit as exc:
            code = exc.code
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(list(args), code if isinstance(code, int) else 1,
                                           out, err)
    return run


def test_a_mistyped_model_path_is_one_line_before_any_service_starts(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    result = _strand("serve", "--model", str(missing), "--port", "0")
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"strand serve: error: model directory {str(missing)!r} does not exist (--model)"]
    assert "ready" not in result.stdout


@pytest.mark.parametrize(("command", "flags", "line"), [
    ("serve", ["--kv-cache-dtype", "fp8"], "strand serve: error: kv_cache_dtype must be one of "
                                           "auto, bfloat16, got 'fp8' (fp8 caches are not "
                                           "supported)"),
    ("demo", ["--max-num-seqs", "0"], "strand demo: error: max_num_seqs must be >= 1, got 0"),
])
def test_a_bad_engine_flag_is_one_line_before_any_stage_starts(
        strand_here: Callable[..., subprocess.CompletedProcess[str]], command: str,
        flags: list[str], line: str) -> None:
    # Checked where the stack is launched: an engine stage refusing it would only be seen as
    # "engine exited with code 1 before it was healthy".
    result = strand_here(command, *flags, "--port", "0")
    assert result.returncode == 1
    assert result.stderr.splitlines() == [line]
    assert "ready" not in result.stdout


def test_debug_shows_the_traceback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                   strand_here: Callable[..., subprocess.CompletedProcess[str]]
                                   ) -> None:
    missing = str(tmp_path / "no-such-model")
    results = [strand_here("--debug", "serve", "--model", missing, "--port", "0")]
    monkeypatch.setenv("STRAND_LOG_LEVEL", "debug")
    results.append(strand_here("serve", "--model", missing, "--port", "0"))
    for result in results:
        assert result.returncode == 1
        assert "Traceback (most recent call last)" in result.stderr
        assert result.stderr.splitlines()[-1].startswith("strand serve: error: model directory")


def test_a_bad_arch_is_one_line(strand_here: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    result = strand_here("make-tiny-model", "/nonexistent/out", "--arch", "gpt9")
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"strand make-tiny-model: error: arch must be one of {', '.join(ARCHITECTURES)}, "
        f"got 'gpt9'"]


def test_unknown_command_and_version(strand_here: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    bogus = strand_here("bogus")
    assert bogus.returncode == 2
    assert bogus.stderr.splitlines()[0].startswith("strand: error: unknown command 'bogus'")
    version = strand_here("--version")
    assert version.returncode == 0
    from importlib import metadata

    assert version.stdout == f"strand {metadata.version('strand')}\n"


def test_make_tiny_model_flags_have_help(strand_here: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    result = strand_here("make-tiny-model", "--help")
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    for flag, default in ((f"--arch ARCH architecture: {', '.join(ARCHITECTURES)}", "llama"),
                          ("--num-layers NUM_LAYERS decoder layers", "2"),
                          ("--hidden-size HIDDEN_SIZE hidden size", "64"),
                          ("--num-heads NUM_HEADS attention heads", "4"),
                          ("--num-kv-heads NUM_KV_HEADS KV heads", "2"),
                          ("--vocab-size VOCAB_SIZE vocabulary size", "512"),
                          ("--seed SEED seed of the random weights", "0")):
        assert flag in text
        assert f"(default: {default})" in text.split(flag)[1][:90]


def test_model_dir_check_names_what_is_missing(tiny_model_dir: Path, tmp_path: Path) -> None:
    check_model_dir(str(tiny_model_dir))
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(UserError, match="no \\*.safetensors"):
        check_model_dir(str(tmp_path))
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(UserError, match="has no tokenizer.json .or pass --skip-tokenizer-init"):
        check_model_dir(str(tmp_path))
    check_model_dir(str(tmp_path), tokenizer=str(tiny_model_dir))
    check_model_dir(str(tmp_path), needs_tokenizer=False)  # --skip-tokenizer-init
    with pytest.raises(UserError, match="no config.json"):
        check_model_dir(str(tmp_path / ".."))


def test_a_gguf_directory_passes_while_its_file_is_there(tiny_model_dir: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # A directory converted from a GGUF file holds no *.safetensors: its weights are the file's.
    pytest.importorskip("gguf")
    from strand.engine_core.model_executor.gguf import gguf_to_hf_dir
    from tests.engine_core.model_executor.gguf_writer import write_gguf

    monkeypatch.setenv("STRAND_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "tiny.gguf"
    write_gguf(tiny_model_dir, path, "Q8_0")
    converted = gguf_to_hf_dir(path)
    check_model_dir(str(converted))
    path.unlink()
    with pytest.raises(UserError, match="holds no weights: they are read from .*tiny.gguf"):
        check_model_dir(str(converted))


def test_client_with_no_server_raises_a_connection_error_naming_the_address() -> None:
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    with EngineClient(address, timeout=10) as client:
        with pytest.raises(ServerUnavailable, match=f"no strand gateway answering at {address}"):
            client.step()
        with pytest.raises(ConnectionError, match=address):
            list(client.generate("hi"))


@pytest.mark.parametrize("stage", ["tokenizer", "engine", "detokenizer"])
def test_a_stage_alone_checks_its_model_path_first(
        stage: str, tmp_path: Path,
        strand_here: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    missing = str(tmp_path / "no-such-model")
    result = strand_here(stage, "--model", missing, "--port", "0")
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"strand {stage}: error: model directory {missing!r} does not exist (--model)"]


def test_an_engine_stage_with_a_bad_cpu_binding_says_so_before_loading(
        tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch,
        strand_here: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    monkeypatch.setenv("STRAND_CPU_BIND", "yes")
    result = strand_here("engine", "--model", str(tiny_model_dir), "--port", "0")
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "strand engine: error: STRAND_CPU_BIND must be one of auto, off, got 'yes'"]


class _Unavailable(grpc.RpcError):
    def __init__(self, details: str) -> None:
        self._details = details

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return self._details


def test_a_stage_the_gateway_cannot_reach_is_not_taken_for_the_gateway() -> None:
    own = _Unavailable("failed to connect to all addresses; last error: UNKNOWN: "
                       "ipv4:127.0.0.1:9: Failed to connect to remote host: Connection refused")
    assert isinstance(translate(own, "127.0.0.1:9"), ServerUnavailable)
    # The gateway answered: one of its stages is down (its details say which).
    relayed = _Unavailable("engine stage is unavailable: failed to connect to all addresses")
    assert translate(relayed, "127.0.0.1:9") is relayed
