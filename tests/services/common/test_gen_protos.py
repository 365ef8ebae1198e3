"""The committed generated code is exactly what the one command produces from protos/."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from strand.services.common import gen_protos

# What only says which grpcio-tools made the files: another version of the tool on a developer's
# machine must not read as stale protos.
_TOOL_VERSION = re.compile(
    r"# Protobuf Python Version: .*\n"
    r"|_runtime_version\.ValidateProtobufRuntimeVersion\(\n(?:.*\n)*?\)\n"
    r"|GRPC_GENERATED_VERSION = .*\n")


def _normalized(text: str) -> str:
    return _TOOL_VERSION.sub("", text)


def test_tool_version_lines_are_all_that_normalizing_removes() -> None:
    generated = (gen_protos.DEFAULT_OUT / "strand" / "v1" / "types_pb2.py").read_text()
    removed = len(generated) - len(_normalized(generated))
    assert 0 < removed < 250
    assert "AddSerializedFile" in _normalized(generated)


def test_generated_code_matches_protos(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools")
    gen_protos.generate(tmp_path)
    fresh = {p.relative_to(tmp_path): p.read_text() for p in tmp_path.rglob("*.py*")}
    committed_root = gen_protos.DEFAULT_OUT
    committed = {p.relative_to(committed_root): p.read_text()
                 for p in committed_root.rglob("*.py*") if "__pycache__" not in p.parts}
    assert sorted(map(str, fresh)) == sorted(map(str, committed)), \
        "run `python -m strand.services.common.gen_protos`: the generated file set is stale"
    stale = [str(name) for name, text in fresh.items()
             if _normalized(committed[name]) != _normalized(text)]
    assert stale == [], f"stale generated files (run `python -m strand.services.common.gen_protos`): {stale}"


def test_generated_modules_import_from_services_package() -> None:
    from strand.services._proto.strand.v1 import gateway_pb2, types_pb2

    assert gateway_pb2.DESCRIPTOR.package == "strand.v1"
    assert gateway_pb2.AddRequestRequest.DESCRIPTOR.fields_by_name["params"].message_type \
        is types_pb2.SamplingParams.DESCRIPTOR
