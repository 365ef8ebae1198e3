"""LLM.score's pairs and scores (vLLM's): data_1 against data_2, 1:1, 1:N or N:N.

A cross-encoder (a sequence classifier with one label) reads each pair as one prompt, the
tokenizer's pair template joining the two texts, and scores it by the sigmoid of its logit. An
embedding model embeds each text and scores a pair by the cosine similarity of the two.
"""

from __future__ import annotations

from typing import Any

import torch

from engine_core.outputs import PoolingRequestOutput, ScoringOutput, ScoringRequestOutput


def pair_up(data_1: Any, data_2: Any) -> list[tuple[Any, Any]]:
    """The pairs to score; one data_1 item is scored against every data_2 item. ValueError
    naming the field for an empty side or lengths that are not 1:1, 1:N or N:N."""
    firsts, seconds = _as_list(data_1), _as_list(data_2)
    for name, items in (("data_1", firsts), ("data_2", seconds)):
        if not items:
            raise ValueError(f"{name} must not be empty")
    if len(firsts) == 1:
        firsts = firsts * len(seconds)
    elif len(firsts) != len(seconds):
        raise ValueError(f"data_1 and data_2 must be 1:1, 1:N or N:N, got {len(firsts)} and "
                         f"{len(seconds)} items")
    return list(zip(firsts, seconds, strict=True))


def _as_list(data: Any) -> list[Any]:
    """One prompt (a string or a prompt dict), or a sequence of them."""
    return [data] if isinstance(data, (str, dict)) else list(data)


def cross_encoder_prompt(first: object, second: object) -> dict[str, object]:
    """One pair as one prompt, which the input processor joins by the tokenizer's pair
    template."""
    if not isinstance(first, str) or not isinstance(second, str):
        raise ValueError("a cross-encoder scores text pairs: data_1 and data_2 must be strings, "
                         f"got {type(first).__name__} and {type(second).__name__}")
    return {"prompt": first, "text_pair": second}


def cross_encoder_score(output: PoolingRequestOutput) -> ScoringRequestOutput:
    """A one-label classifier's output as a score (its sigmoid, or the logit with
    use_activation=False)."""
    return ScoringRequestOutput(output.request_id, ScoringOutput(output.outputs.values[0]),
                                output.prompt_token_ids, output.finished)


def embedding_score(first: PoolingRequestOutput,
                    second: PoolingRequestOutput) -> ScoringRequestOutput:
    """The cosine similarity of two embeddings; the pair's ids are both prompts' in order."""
    a = torch.tensor(first.outputs.values, dtype=torch.float32)
    b = torch.tensor(second.outputs.values, dtype=torch.float32)
    score = float(torch.nn.functional.cosine_similarity(a, b, dim=0))
    return ScoringRequestOutput(f"{first.request_id}_{second.request_id}", ScoringOutput(score),
                                first.prompt_token_ids + second.prompt_token_ids)
