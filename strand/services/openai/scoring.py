"""vLLM's pooling endpoints past embeddings: /classify, /score and /rerank (Jina's and Cohere's
shape, also at /v1/rerank and /v2/rerank), from a server started with --runner pooling.

A sequence classifier's labels come from the gateway's GetServerInfo. /score and /rerank read
each (query, document) pair as one prompt on a cross-encoder (a one-label classifier), or
compare the two texts' embeddings (cosine similarity) on a model that embeds, as vLLM scores
with either kind. Every prompt of a request is in the engine at once, all or nothing
(embeddings.embed_all).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict

from strand.engine_core.lora.request import LoRARequest
from strand.engine_core.outputs import PoolingRequestOutput
from strand.engine_core.pooling.params import PoolingParams
from strand.engine_core.pooling.scoring import cosine, distinct, pair_up
from strand.services.common.convert import PromptType
from strand.services.openai.embeddings import MAX_INPUTS, FrontLike, embed_all
from strand.services.openai.errors import bad_request
from strand.services.openai.params import prompts_of


class _Pooling(BaseModel):
    model_config = ConfigDict(extra="allow")  # unknown fields: ignored with a warning

    model: str | None = None
    user: str | None = None
    truncate_prompt_tokens: int | None = None
    # vLLM's: a classifier's softmax (sigmoid for one label); false: the raw logits.
    use_activation: bool | None = None


class ClassifyRequest(_Pooling):
    input: str | list[str] | list[int] | list[list[int]]


class ScoreRequest(_Pooling):
    text_1: str | list[str]
    text_2: str | list[str]


class RerankRequest(_Pooling):
    query: str
    documents: list[str]
    top_n: int | None = None  # None or 0: every document
    return_documents: bool = True


def params_for(req: _Pooling, task: str) -> PoolingParams:
    try:
        return PoolingParams(truncate_prompt_tokens=req.truncate_prompt_tokens, task=task,
                             use_activation=req.use_activation)
    except ValueError as exc:
        raise bad_request(str(exc)) from None


def bounded(items: list[Any], field: str) -> list[Any]:
    if not items:
        raise bad_request(f"{field} must not be empty", field)
    if len(items) > MAX_INPUTS:
        raise bad_request(f"{field} must hold at most {MAX_INPUTS} items, got {len(items)}",
                          field)
    return items


async def classify(front: FrontLike, req: ClassifyRequest, model: str,
                   lora: LoRARequest | None) -> dict[str, Any]:
    prompts = bounded(prompts_of(req.input, "input"), "input")
    outputs = await embed_all(front.client(), prompts, params_for(req, "classify"), lora)
    labels = list((await front.info()).get("labels") or [])
    data = []
    for i, out in enumerate(outputs):
        probs = out.outputs.values
        best = max(range(len(probs)), key=probs.__getitem__)
        data.append({"index": i, "label": labels[best] if best < len(labels) else None,
                     "probs": probs, "num_classes": len(probs)})
    return {"id": f"classify-{uuid.uuid4().hex}", "object": "list",
            "created": int(time.time()), "model": model, "data": data,
            "usage": _usage(outputs)}


async def score_pairs(front: FrontLike, req: _Pooling, pairs: list[tuple[str, str]],
                      lora: LoRARequest | None) -> tuple[list[float], int]:
    """Each pair's score, and the prompt tokens spent: a cross-encoder's (the pair as one
    prompt), or the cosine similarity of an embedding model's two embeddings."""
    client = front.client()
    if (await front.info()).get("labels"):
        prompts: list[PromptType] = [{"prompt": a, "text_pair": b} for a, b in pairs]
        outputs = await embed_all(client, prompts, params_for(req, "score"), lora)
        return [out.outputs.values[0] for out in outputs], _tokens(outputs)
    if req.use_activation is not None:
        raise bad_request("use_activation applies to a classifier; this model embeds (its "
                          "scores are cosine similarities)", "use_activation")
    texts, indices = distinct(pairs)
    outputs = await embed_all(client, texts, params_for(req, "embed"), lora)
    return ([cosine(outputs[i].outputs.values, outputs[j].outputs.values) for i, j in indices],
            _tokens(outputs))


async def score(front: FrontLike, req: ScoreRequest, model: str,
                lora: LoRARequest | None) -> dict[str, Any]:
    bounded([req.text_1] if isinstance(req.text_1, str) else req.text_1, "text_1")
    bounded([req.text_2] if isinstance(req.text_2, str) else req.text_2, "text_2")
    try:
        pairs = pair_up(req.text_1, req.text_2, ("text_1", "text_2"))
    except ValueError as exc:
        raise bad_request(str(exc), "text_2") from None
    scores, tokens = await score_pairs(front, req, pairs, lora)
    data = [{"index": i, "object": "score", "score": s} for i, s in enumerate(scores)]
    return {"id": f"score-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()),
            "model": model, "data": data,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0}}


async def rerank(front: FrontLike, req: RerankRequest, model: str,
                 lora: LoRARequest | None) -> dict[str, Any]:
    documents = bounded(req.documents, "documents")
    if req.top_n is not None and req.top_n < 0:
        raise bad_request(f"top_n must be >= 0, got {req.top_n}", "top_n")
    scores, tokens = await score_pairs(front, req, [(req.query, d) for d in documents], lora)
    order = sorted(range(len(documents)), key=lambda i: -scores[i])
    if req.top_n:
        order = order[:req.top_n]
    results = [{"index": i, "relevance_score": scores[i],
                "document": {"text": documents[i]} if req.return_documents else None}
               for i in order]
    return {"id": f"rerank-{uuid.uuid4().hex}", "model": model,
            "usage": {"total_tokens": tokens}, "results": results}


def _tokens(outputs: list[PoolingRequestOutput]) -> int:
    return sum(len(out.prompt_token_ids) for out in outputs)


def _usage(outputs: list[PoolingRequestOutput]) -> dict[str, Any]:
    tokens = _tokens(outputs)
    return {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0,
            "prompt_tokens_details": None}
