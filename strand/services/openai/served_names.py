"""--served-model-name NAME ... (vLLM's flag): the names the OpenAI front answers to."""

from __future__ import annotations

from collections.abc import Collection


def check_served_names(names: list[str], lora_modules: Collection[str]) -> None:
    """ValueError naming --served-model-name for an empty name, a repeated one, or one that is
    also a LoRA module's (a request naming it would be ambiguous)."""
    seen: set[str] = set()
    for name in names:
        if not name.strip():
            raise ValueError("--served-model-name names must be non-empty")
        if name in seen:
            raise ValueError(f"--served-model-name names must be unique, got {name!r} twice")
        if name in lora_modules:
            raise ValueError(f"--served-model-name {name!r} is also a --lora-modules name")
        seen.add(name)
