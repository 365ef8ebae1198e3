"""/v1/embeddings (OpenAI's, as vLLM serves it with --runner pooling): each input embedded by
the engine's pooler, every input of one request at once; `encoding_format: "base64"` (what the
OpenAI SDK asks for by default) sends each vector's float32 bytes, little-endian."""

from __future__ import annotations

import asyncio
import base64
import struct
import time
import uuid
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict

from strand.engine_core.lora.request import LoRARequest
from strand.engine_core.outputs import PoolingRequestOutput
from strand.engine_core.pooling.params import PoolingParams
from strand.services.async_client import AsyncEngineClient
from strand.services.common.convert import PromptType
from strand.services.openai.errors import bad_request
from strand.services.openai.params import chat_prompt, prompts_of

MAX_INPUTS = 2048  # OpenAI's limit on an embeddings request's input array


class FrontLike(Protocol):
    """What a pooling route needs of the front (app.Front)."""

    def client(self) -> AsyncEngineClient: ...
    async def info(self) -> dict[str, Any]: ...


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="allow")  # unknown fields: ignored with a warning

    model: str | None = None
    input: str | list[str] | list[int] | list[list[int]] | None = None
    # vLLM's chat form instead of input: one conversation, rendered by the model's template.
    messages: list[dict[str, Any]] | None = None
    add_generation_prompt: bool = False
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    encoding_format: Literal["float", "base64"] = "float"
    # a matryoshka model's width (the engine refuses it, by name, for any other model)
    dimensions: int | None = None
    user: str | None = None
    # vLLM's extra fields
    truncate_prompt_tokens: int | None = None
    normalize: bool | None = None  # None: the server's --pooler-config normalize


def embedding_prompts(req: EmbeddingRequest) -> list[PromptType]:
    """The inputs as prompts: a string, a list of strings, token ids or lists of them; at most
    MAX_INPUTS, OpenAI's bound (every input of a request is in the engine at once). Or vLLM's
    `messages`: one chat, rendered as the chat endpoints render it."""
    if (req.input is None) == (req.messages is None):
        raise bad_request("give exactly one of input and messages", "input")
    if req.messages is not None:
        return [chat_prompt(req.messages, req.add_generation_prompt, None,
                            req.chat_template_kwargs, req.continue_final_message)]
    assert req.input is not None
    prompts = prompts_of(req.input, "input")
    if len(prompts) > MAX_INPUTS:
        raise bad_request(f"input must hold at most {MAX_INPUTS} items, got {len(prompts)}",
                          "input")
    return prompts


def pooling_params(req: EmbeddingRequest) -> PoolingParams:
    try:
        return PoolingParams(truncate_prompt_tokens=req.truncate_prompt_tokens,
                             dimensions=req.dimensions, normalize=req.normalize, task="embed")
    except ValueError as exc:
        field = "dimensions" if str(exc).startswith("dimensions") else None
        raise bad_request(str(exc), field) from None


async def embed_all(client: AsyncEngineClient, prompts: list[PromptType],
                    params: PoolingParams, lora: LoRARequest | None
                    ) -> list[PoolingRequestOutput]:
    """Every input at once, all or nothing: the first to fail cancels the others (a cancelled
    call aborts its request in the engine)."""
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(client.embed(prompt, params, lora_request=lora))
                     for prompt in prompts]
    except BaseExceptionGroup as failed:  # the first failure, as if awaited alone
        raise failed.exceptions[0] from None
    return [task.result() for task in tasks]


def embedding_response(outputs: list[PoolingRequestOutput], model: str,
                       encoding_format: str) -> dict[str, Any]:
    data = [{"index": i, "object": "embedding",
             "embedding": _encoded(out.outputs.values, encoding_format)}
            for i, out in enumerate(outputs)]
    num_tokens = sum(len(out.prompt_token_ids) for out in outputs)
    return {"id": f"embd-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()),
            "model": model, "data": data,
            "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens}}


def _encoded(values: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "float":
        return values
    return base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode("ascii")


async def embeddings(front: FrontLike, req: EmbeddingRequest, model: str,
                     lora: LoRARequest | None) -> dict[str, Any]:
    """/v1/embeddings' answer: every input embedded at once."""
    prompts, params = embedding_prompts(req), pooling_params(req)
    outputs = await embed_all(front.client(), prompts, params, lora)
    return embedding_response(outputs, model, req.encoding_format)
