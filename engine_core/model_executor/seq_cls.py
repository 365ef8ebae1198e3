"""*ForSequenceClassification checkpoints: a supported decoder whose head scores labels.

transformers' classifiers of these families (LlamaForSequenceClassification, Qwen3..., the
cross-encoders and rerankers built on them) are the causal model's body with `score` (a linear
layer, hidden -> num_labels, no bias) in place of `lm_head`, read at the last token. The engine
builds the same body and keeps `score` where the LM head would be (ModelConfig.labels).
"""

from __future__ import annotations

from typing import Any

SUFFIX = "ForSequenceClassification"


def causal_name(architecture: str) -> str | None:
    """"Qwen3ForSequenceClassification" -> "Qwen3ForCausalLM"; None for any other name."""
    if not architecture.endswith(SUFFIX):
        return None
    return architecture.removesuffix(SUFFIX) + "ForCausalLM"


def labels_of(raw: dict[str, Any]) -> tuple[str, ...]:
    """config.json's labels in id order: id2label, else num_labels' "LABEL_i" (transformers'
    default, 2 labels). ValueError naming the field for ids that are not 0..n-1."""
    id2label = raw.get("id2label")
    if id2label:
        if not isinstance(id2label, dict):
            raise ValueError(f"id2label must be an object of id -> label, got {id2label!r}")
        try:
            by_id = {int(key): str(value) for key, value in id2label.items()}
        except ValueError as e:
            raise ValueError(f"id2label keys must be integers, got {sorted(id2label)}") from e
        if sorted(by_id) != list(range(len(by_id))):
            raise ValueError(f"id2label keys must be 0..{len(by_id) - 1}, got {sorted(by_id)}")
        return tuple(by_id[i] for i in range(len(by_id)))
    count = raw.get("num_labels", 2)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"num_labels must be an integer >= 1, got {count!r}")
    return tuple(f"LABEL_{i}" for i in range(count))
