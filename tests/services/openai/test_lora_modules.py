"""--lora-modules NAME=PATH: ids in the flag's order, bad specs named."""

from __future__ import annotations

import pytest

from strand.engine_core import LoRARequest
from strand.services.openai.lora_modules import parse_lora_modules


def test_names_map_to_adapters_with_ids_in_flag_order() -> None:
    assert parse_lora_modules(["sql=/a/sql", "chat=/a/chat=v2"]) == {
        "sql": LoRARequest("sql", 1, "/a/sql"), "chat": LoRARequest("chat", 2, "/a/chat=v2")}
    assert parse_lora_modules([]) == {}


@pytest.mark.parametrize(("specs", "match"), [
    (["sql"], "must be NAME=PATH, got 'sql'"),
    (["=/a"], "must be NAME=PATH"),
    (["sql="], "must be NAME=PATH"),
    (["sql=/a", "sql=/b"], "must be unique, got 'sql' twice"),
])
def test_bad_specs_name_the_flag(specs: list[str], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_lora_modules(specs)
