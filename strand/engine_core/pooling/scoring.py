"""LLM.score's pairs and scores (vLLM's): data_1 against data_2, 1:1, 1:N or N:N.

A cross-encoder (a sequence classifier with one label) reads each pair as one prompt, the
tokenizer's pair template joining the two texts, and scores it by the sigmoid of its logit. An
embedding model embeds each text and scores a pair by the cosine similarity of the two.
"""

from __future__ import annotations

import math
from typing import Any

from strand.engine_core.outputs import PoolingRequestOutput, ScoringOutput, ScoringRequestOutput


def pair_up(data_1: Any, data_2: Any, names: tuple[str, str] = ("data_1", "data_2")
            ) -> list[tuple[Any, Any]]:
    """The pairs to score; one data_1 item is scored against every data_2 item. ValueError
    naming the field (names: the caller's) for an empty side or lengths that are not 1:1, 1:N
    or N:N. Torch-free: the OpenAI front pairs its /score requests here too."""
    firsts, seconds = _as_list(data_1), _as_list(data_2)
    for name, items in zip(names, (firsts, seconds), strict=True):
        if not items:
            raise ValueError(f"{name} must not be empty")
    if len(firsts) == 1:
        firsts = firsts * len(seconds)
    elif len(firsts) != len(seconds):
        raise ValueError(f"{names[0]} and {names[1]} must be 1:1, 1:N or N:N, got "
                         f"{len(firsts)} and {len(seconds)} items")
    return list(zip(firsts, seconds, strict=True))


def distinct(pairs: list[tuple[Any, Any]]) -> tuple[list[Any], list[tuple[int, int]]]:
    """The pairs' items each once (a query scored against N documents is embedded once), and
    each pair's two indices into them. Strings are the same item by value, prompt dicts by
    identity."""
    items: list[Any] = []
    where: dict[object, int] = {}

    def index(item: Any) -> int:
        key = item if isinstance(item, str) else id(item)
        if key not in where:
            where[key] = len(items)
            items.append(item)
        return where[key]

    return items, [(index(a), index(b)) for a, b in pairs]


def cosine(a: list[float], b: list[float]) -> float:
    """The cosine similarity of two embeddings (in float64)."""
    norms = math.sqrt(math.fsum(x * x for x in a)) * math.sqrt(math.fsum(y * y for y in b))
    return math.fsum(x * y for x, y in zip(a, b, strict=True)) / max(norms, 1e-12)


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
    score = cosine(first.outputs.values, second.outputs.values)
    return ScoringRequestOutput(f"{first.request_id}_{second.request_id}", ScoringOutput(score),
                                first.prompt_token_ids + second.prompt_token_ids)
