"""--lora-modules NAME=PATH ... (vLLM's flag): adapters the OpenAI front serves by model name.

A request whose `model` is NAME runs with that adapter; /v1/models lists each beside the base
model. Ids are given in the flag's order from 1, so every front of a stack started with the
same flag names an adapter by the same id (the engine's prefix-cache key).
"""

from __future__ import annotations

from strand.engine_core.lora.request import LoRARequest


def parse_lora_modules(specs: list[str]) -> dict[str, LoRARequest]:
    """ValueError naming --lora-modules for a spec that is not NAME=PATH or a repeated NAME."""
    modules: dict[str, LoRARequest] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--lora-modules entries must be NAME=PATH, got {spec!r}")
        if name in modules:
            raise ValueError(f"--lora-modules names must be unique, got {name!r} twice")
        modules[name] = LoRARequest(name, len(modules) + 1, path)
    return modules
