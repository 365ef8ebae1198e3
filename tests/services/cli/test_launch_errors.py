"""A service that exits while the launcher waits for it: the error carries the end of its log."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from strand.services.launch import StackConfig, launch_stack


def test_a_stage_that_exits_at_startup_is_reported_with_its_last_log_lines(
        tiny_model_dir: Path, tmp_path: Path) -> None:
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    (model / "tokenizer.json").unlink()  # every stage refuses the directory, naming the file
    with pytest.raises(RuntimeError) as info:
        launch_stack(StackConfig(model=str(model), log_dir=tmp_path / "logs"), timeout=60)
    message = str(info.value)
    assert "exited with code 1 before it was healthy; the end of its log:" in message
    assert "tokenizer.json" in message  # the stage's own one-line reason


def test_without_a_log_dir_the_error_is_the_bare_exit(tiny_model_dir: Path,
                                                      tmp_path: Path) -> None:
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    (model / "tokenizer.json").unlink()
    with pytest.raises(RuntimeError, match=r"exited with code 1 before it was healthy$"):
        launch_stack(StackConfig(model=str(model)), timeout=60)
