"""*ForSequenceClassification checkpoints: a supported decoder whose head scores labels.

transformers' classifiers of these families (LlamaForSequenceClassification, Qwen3..., the
cross-encoders and rerankers built on them) are the causal model's body with `score` (a linear
layer, hidden -> num_labels, no bias) in place of `lm_head`, read at the last token. The engine
builds the same body and keeps `score` where the LM head would be (ModelConfig.labels).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the tokenizer and detokenizer stages read config.json without torch
    import torch

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


# vLLM's hf_overrides for a causal reranker (Qwen3-Reranker, mxbai-rerank-v2, bge-reranker-v2-
# gemma) served as a classifier: `classifier_from_token` names tokens of the vocabulary, and the
# score layer is made of the LM head's rows for them. "from_2_way_softmax" (two tokens, [no,
# yes]): one label, row(yes) - row(no), so its sigmoid is softmax([no, yes])[yes];
# "no_post_processing": one label per token, each its row.
SCORE_METHODS = ("from_2_way_softmax", "no_post_processing")


def score_config(raw: dict[str, Any]) -> dict[str, Any]:
    """config.json as its labels are read: with classifier_from_token, as many labels as its
    method makes (a stale id2label of another length dropped). ValueError naming the field."""
    tokens, method = _score_tokens(raw)
    if not tokens:
        return raw
    count = 1 if method == "from_2_way_softmax" else len(tokens)
    fixed = {**raw, "num_labels": count}
    if len(raw.get("id2label") or {}) != count:
        fixed.pop("id2label", None)
    return fixed


def score_fields(raw: dict[str, Any], labels: tuple[str, ...]) -> dict[str, Any]:
    """ModelConfig's score_tokens and score_method for a classifier built from LM head rows."""
    tokens, method = _score_tokens(raw)
    if not tokens or not labels:
        return {}
    return {"score_tokens": tokens, "score_method": method}


def _score_tokens(raw: dict[str, Any]) -> tuple[tuple[str, ...], str | None]:
    tokens = raw.get("classifier_from_token")
    if tokens is None:
        return (), None
    if (not isinstance(tokens, list) or not tokens
            or not all(isinstance(t, str) and t for t in tokens)):
        raise ValueError(f"classifier_from_token must be a non-empty list of token strings, "
                         f"got {tokens!r}")
    method = raw.get("method")
    if method is None and raw.get("is_original_qwen3_reranker"):
        method = "from_2_way_softmax"  # vLLM's older spelling of the same
    if method not in SCORE_METHODS:
        raise ValueError(f"method must be one of {list(SCORE_METHODS)} with "
                         f"classifier_from_token, got {method!r}")
    if method == "from_2_way_softmax" and len(tokens) != 2:
        raise ValueError(f"method 'from_2_way_softmax' needs two classifier_from_token "
                         f"([no, yes]), got {tokens!r}")
    return tuple(tokens), str(method)


def score_rows(head: torch.Tensor, method: str) -> torch.Tensor:
    """The score layer from the LM head's rows of the tokens, in their order (float32)."""
    rows = head.float()
    if method == "from_2_way_softmax":
        return (rows[1] - rows[0])[None]
    return rows


def score_token_ids(tokens: tuple[str, ...], tokenizer_dir: str | None) -> tuple[int, ...]:
    """classifier_from_token's ids in the model's tokenizer; ValueError naming a token that is
    not in its vocabulary (or no tokenizer to look them up in)."""
    if tokenizer_dir is None:
        raise ValueError("classifier_from_token needs the model's tokenizer to find its tokens, "
                         "but skip_tokenizer_init is True")
    from strand.engine_core.processing.tokenizer import Tokenizer

    backend = Tokenizer.from_dir(tokenizer_dir).backend
    ids = []
    for token in tokens:
        token_id = backend.token_to_id(token)
        if token_id is None:
            raise ValueError(f"classifier_from_token {token!r} is not a token of the tokenizer's "
                             "vocabulary")
        ids.append(int(token_id))
    return tuple(ids)


# sentence-transformers' CrossEncoder names its activation in config.json
# (sentence_transformers.activation_fn), which vLLM honours; without it one label is a sigmoid
# and several a softmax.
_ACTIVATIONS = ("sigmoid", "softmax", "identity")


def activation_of(raw: dict[str, Any], num_labels: int) -> str:
    """"sigmoid" | "softmax" | "identity": what turns a classifier's logits into its output.
    ValueError naming an activation_fn the engine does not apply."""
    named = (raw.get("sentence_transformers") or {}).get("activation_fn")
    if named is None:
        return "sigmoid" if num_labels == 1 else "softmax"
    kind = str(named).rsplit(".", 1)[-1].lower()  # "torch.nn.modules.activation.Sigmoid"
    if kind not in _ACTIVATIONS:
        raise ValueError(f"sentence_transformers.activation_fn must be Sigmoid, Softmax or "
                         f"Identity, got {named!r}")
    return kind
