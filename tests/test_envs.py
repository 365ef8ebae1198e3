"""strand/envs.py is the only reader of the environment, and docs/environment.md lists all it reads."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

from strand import envs

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "strand"
DOC = ROOT / "docs" / "environment.md"
# os.environ.<method>(...) calls that write, or copy the whole environment: allowed anywhere.
WRITE_METHODS = frozenset({"setdefault", "update", "pop", "copy"})


def _accessors() -> list[str]:
    return [name for name, fn in inspect.getmembers(envs, inspect.isfunction)
            if not name.startswith("_") and fn.__module__ == envs.__name__]


def _is_environ(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr in ("environ", "environb")
            and isinstance(node.value, ast.Name) and node.value.id == "os")


def _reads(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, what) for every read of a variable: os.getenv, os.environ[...] loaded,
    os.environ.get/items/..., `in os.environ`, os.environ bound to a name; not writes
    (os.environ[k] = v, del, setdefault, update, pop), whole copies (dict(os.environ),
    {**os.environ}, os.environ.copy()) or the mapping passed on whole (an argument, a default)."""
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "os":
            for alias in node.names:
                if alias.name in ("environ", "environb", "getenv", "getenvb"):
                    found.append((node.lineno, f"from os import {alias.name}"))
        if (isinstance(node, ast.Attribute) and node.attr in ("getenv", "getenvb")
                and isinstance(node.value, ast.Name) and node.value.id == "os"):
            found.append((node.lineno, f"os.{node.attr}"))
        if not (_is_environ(node) and isinstance(node, ast.Attribute)):
            continue
        parent = parents.get(node)
        if isinstance(parent, ast.Subscript) and parent.value is node:
            if isinstance(parent.ctx, ast.Load):
                found.append((node.lineno, "os.environ[...]"))
        elif isinstance(parent, ast.Attribute):
            call = parents.get(parent)
            if not (isinstance(call, ast.Call) and call.func is parent
                    and parent.attr in WRITE_METHODS):
                found.append((node.lineno, f"os.environ.{parent.attr}"))
        elif isinstance(parent, ast.Call) and node in parent.args:
            pass  # passed on whole: dict(os.environ), a subprocess's env
        elif isinstance(parent, ast.keyword | ast.arguments):
            pass  # passed on whole, or a default argument for a mapping to write to
        elif isinstance(parent, ast.Dict) and node in parent.values:
            pass  # {**os.environ, ...}
        else:
            found.append((node.lineno, f"os.environ in a {type(parent).__name__}"))
    return found


def test_only_envs_reads_the_environment() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == PACKAGE / "envs.py" or "_proto" in path.parts:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        offenders += [f"{path.relative_to(ROOT)}:{line}: {what}" for line, what in _reads(tree)]
    assert not offenders, ("read the environment through an accessor in strand/envs.py "
                           "instead:\n" + "\n".join(offenders))


@pytest.mark.parametrize(("source", "reads"), [
    ("import os\nx = os.environ.get('A')", True),
    ("import os\nx = os.environ['A']", True),
    ("import os\nx = 'A' in os.environ", True),
    ("import os\nx = os.getenv('A')", True),
    ("import os\nenv = os.environ", True),
    ("from os import environ", True),
    ("import os\nos.environ['A'] = '1'", False),
    ("import os\nos.environ.setdefault('A', '1')", False),
    ("import os\ndel os.environ['A']", False),
    ("import os\nenv = dict(os.environ)", False),
    ("import os\nenv = {**os.environ, 'A': '1'}", False),
    ("import os\ndef f(environ=os.environ): pass", False),
])
def test_the_scan_tells_reads_from_writes_and_copies(source: str, reads: bool) -> None:
    assert bool(_reads(ast.parse(source))) is reads


def test_every_accessor_and_variable_is_documented() -> None:
    doc = DOC.read_text(encoding="utf-8")
    missing = [f"envs.{name}()" for name in _accessors() if f"envs.{name}()" not in doc]
    source = (PACKAGE / "envs.py").read_text(encoding="utf-8")
    names = {node.value for node in ast.walk(ast.parse(source))
             if isinstance(node, ast.Constant) and isinstance(node.value, str)
             and re.fullmatch(r"[A-Z][A-Z0-9]*_[A-Z0-9_]+|RANK", node.value)}
    missing += sorted(name for name in names if f"`{name}`" not in doc)
    assert not missing, f"not in docs/environment.md: {missing}"


def test_accessors_read_the_environment_when_called(monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Path) -> None:
    monkeypatch.delenv("STRAND_CACHE_DIR", raising=False)
    assert envs.cache_dir() == Path.home() / ".cache" / "strand"
    monkeypatch.setenv("STRAND_CACHE_DIR", str(tmp_path))
    assert envs.cache_dir() == tmp_path


@pytest.mark.parametrize(("value", "expected"), [(None, "auto"), ("", "auto"), ("grpc", "grpc")])
def test_an_empty_choice_means_its_default(monkeypatch: pytest.MonkeyPatch, value: str | None,
                                           expected: str) -> None:
    if value is None:
        monkeypatch.delenv("STRAND_STAGE_TRANSPORT", raising=False)
    else:
        monkeypatch.setenv("STRAND_STAGE_TRANSPORT", value)
    assert envs.stage_transport() == expected


def test_set_at_all_switches_count_zero_as_set(monkeypatch: pytest.MonkeyPatch) -> None:
    # As the C++ kernels read STRAND_DISABLE_AVX512_BF16: present means off, whatever its value.
    monkeypatch.setenv("STRAND_DISABLE_AVX512_BF16", "0")
    monkeypatch.setenv("STRAND_LINEAR_PANELS", "0")
    assert envs.disable_avx512_bf16() is True
    assert envs.linear_panels() is False


def test_torchrun_is_none_until_every_variable_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    values = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0",
              "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    assert envs.torchrun() == values
    monkeypatch.delenv("MASTER_PORT")
    assert envs.torchrun() is None
