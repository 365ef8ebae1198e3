"""Every code block of README.md, docs/*.md, benchmarks/README.md and strand/services/README.md runs, so the documentation cannot drift from the code.

- python blocks are executed as written, after SUBSTITUTIONS: the placeholder model directory
  becomes a tiny random model, and the README's gateway address that of the e2e tests' shared
  stack on a free port (started only when some block names it). Nothing else is changed.
- bash blocks are checked, not run (they install packages, run the suite or serve forever):
  every `strand X ...` command must exist, `strand X --help` must work, and every `--flag` on the
  line must be one X accepts; every `python -m benchmarks.NAME` or `python -m strand.X` module
  must be importable (found, not run).
"""

from __future__ import annotations

import importlib.util
import io
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from strand.services import cli
from strand.services.launch import Stack

REPO = Path(__file__).resolve().parents[2]
DOC_FILES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "benchmarks/README.md",
             REPO / "strand/services/README.md"]
MODEL_PLACEHOLDER = "/path/to/hf-dir"
GATEWAY_PLACEHOLDER = "127.0.0.1:50051"
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)


@dataclass(frozen=True, slots=True)
class Block:
    path: Path
    line: int
    language: str
    code: str

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


def code_blocks(paths: list[Path]) -> list[Block]:
    blocks = []
    for path in paths:
        text = path.read_text(encoding="utf-8")
        for match in _FENCE.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            blocks.append(Block(path, line, match.group(1) or "text", match.group(2)))
    return blocks


BLOCKS = code_blocks(DOC_FILES)
PYTHON = [b for b in BLOCKS if b.language == "python"]
BASH = [b for b in BLOCKS if b.language in ("bash", "sh", "shell", "console")]
YAML = [b for b in BLOCKS if b.language == "yaml"]


def test_the_docs_have_blocks_of_each_kind() -> None:
    # The runner itself can break (a changed fence style would make every test vacuous).
    assert len(PYTHON) >= 2 and len(BASH) >= 2
    assert {b.language for b in BLOCKS} <= {"python", "bash", "text", "yaml"}, \
        "a new language: check it"


@pytest.fixture
def gateway_address(stack: Stack) -> str:
    return stack.gateway_address  # the e2e tests' shared manual-mode stack


@pytest.mark.parametrize("block", PYTHON, ids=[b.id for b in PYTHON])
def test_python_block_runs(block: Block, tiny_model_dir: Path, request: pytest.FixtureRequest,
                           capsys: pytest.CaptureFixture[str]) -> None:
    code = block.code.replace(MODEL_PLACEHOLDER, str(tiny_model_dir))
    if GATEWAY_PLACEHOLDER in code:
        code = code.replace(GATEWAY_PLACEHOLDER, request.getfixturevalue("gateway_address"))
    namespace: dict[str, object] = {"__name__": "__docs__"}
    exec(compile(code, block.id, "exec"), namespace)  # noqa: S102 - the point of the test
    client = namespace.get("client")
    if client is not None:
        # A shared stack: the block must not leave a request behind.
        assert client.get_num_unfinished_requests() == 0  # type: ignore[attr-defined]
        client.close()  # type: ignore[attr-defined]


def shell_commands(code: str) -> Iterator[list[str]]:
    """Each command of a bash block, as tokens: `\\` continuations joined, comments dropped,
    `&&` chains split."""
    for raw in code.replace("\\\n", " ").splitlines():
        for part in raw.split("&&"):
            tokens = shlex.split(part, comments=True)
            if tokens:
                yield tokens


def strand_commands(code: str) -> Iterator[list[str]]:
    """Each `strand ...` command of a bash block, as tokens."""
    return (tokens for tokens in shell_commands(code) if tokens[0] == "strand")


_HELP: dict[str, str] = {}


def _help(command: str) -> str:
    """`strand COMMAND --help`, run in this process (a subprocess per command costs seconds)."""
    if command not in _HELP:
        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err), pytest.raises(SystemExit) as exit_info:
            cli.main([command, "--help"])
        assert exit_info.value.code in (0, None), f"strand {command} --help: {err.getvalue()}"
        _HELP[command] = out.getvalue()
    return _HELP[command]


@pytest.mark.parametrize("block", BASH, ids=[b.id for b in BASH])
def test_bash_block_commands_exist_with_their_flags(block: Block) -> None:
    for tokens in strand_commands(block.code):
        command, flags = tokens[1], [t.split("=")[0] for t in tokens[2:] if t.startswith("--")]
        if command in ("--version", "--debug"):
            continue
        accepted = set(re.findall(r"--[a-z0-9][a-z0-9-]*", _help(command)))
        unknown = [f for f in flags if f not in accepted and f != "--debug"]
        assert unknown == [], f"{block.id}: strand {command} does not take {unknown}"


def test_the_bash_check_catches_a_wrong_flag() -> None:
    bad = Block(REPO / "README.md", 0, "bash", "strand serve --modle x  # typo\n")
    with pytest.raises(AssertionError, match="does not take \\['--modle'\\]"):
        test_bash_block_commands_exist_with_their_flags(bad)
    with pytest.raises(AssertionError, match="strand bogus --help"):
        test_bash_block_commands_exist_with_their_flags(
            Block(REPO / "README.md", 0, "bash", "pip install x && strand bogus\n"))


def python_modules(code: str) -> Iterator[str]:
    """Each `python -m MODULE` of a bash block whose module is the repository's own (benchmarks, strand)."""
    for tokens in shell_commands(code):
        for i, token in enumerate(tokens[:-2]):
            if token.startswith("python") and tokens[i + 1] == "-m" \
                    and tokens[i + 2].split(".")[0] in ("benchmarks", "strand"):
                yield tokens[i + 2]


@pytest.mark.parametrize("block", BASH, ids=[b.id for b in BASH])
def test_bash_block_modules_exist(block: Block) -> None:
    # find_spec imports only the parent packages (strand, benchmarks): cheap, nothing is run.
    missing = [m for m in python_modules(block.code) if importlib.util.find_spec(m) is None]
    assert missing == [], f"{block.id}: no module {missing}"


def test_the_module_check_catches_a_missing_module() -> None:
    bad = Block(REPO / "benchmarks/README.md", 0, "bash",
                "python -m benchmarks.offline --num-prompts 8 && python -m benchmarks.nonesuch\n")
    with pytest.raises(AssertionError, match="no module \\['benchmarks.nonesuch'\\]"):
        test_bash_block_modules_exist(bad)


@pytest.mark.parametrize("block", YAML, ids=[b.id for b in YAML])
def test_yaml_block_is_a_valid_prometheus_config(block: Block, tmp_path: Path) -> None:
    """YAML blocks are Prometheus scrape configs: they parse, and promtool (Debian's prometheus
    package) accepts them where it is installed."""
    config = yaml.safe_load(block.code)
    assert isinstance(config, dict) and config.get("scrape_configs"), block.id
    promtool = shutil.which("promtool")
    if promtool is None:
        return
    path = tmp_path / "prometheus.yml"
    path.write_text(block.code)
    result = subprocess.run([promtool, "check", "config", str(path)], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, f"{block.id}: {result.stdout}{result.stderr}"
