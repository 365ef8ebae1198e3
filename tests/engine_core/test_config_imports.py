"""config.py imports no feature module: features import config, never the other way (as vLLM's
vllm/config/). It may import only the plain-data modules beside it, which import nothing from
strand."""

from __future__ import annotations

import ast
from pathlib import Path

ENGINE_CORE = Path(__file__).resolve().parents[2] / "strand" / "engine_core"
PLAIN_DATA = ("strand.engine_core.chat_config", "strand.engine_core.pooler_config",
              "strand.engine_core.speculative_config")


def _strand_imports(module: str) -> set[str]:
    """Every strand module `module` imports, at its top or inside a function (relative imports
    counted as strand's)."""
    path = ENGINE_CORE / f"{module.rsplit('.', 1)[1]}.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "strand"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                found.add("." * node.level + (node.module or ""))
            elif node.module and node.module.split(".")[0] == "strand":
                found.add(node.module)
    return found


def test_config_imports_only_plain_data_modules() -> None:
    assert _strand_imports("strand.engine_core.config") <= set(PLAIN_DATA)


def test_the_plain_data_modules_import_nothing_from_strand() -> None:
    assert {module: _strand_imports(module) for module in PLAIN_DATA} == {
        module: set() for module in PLAIN_DATA}
