"""Inference.Tokenize / Detokenize over the stack (vLLM's /tokenize and /detokenize): the ids a
request would carry, from the tokenizer stage alone, and bad input refused with the engine left
untouched."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from strand.engine_core.sampling_params import RequestOutputKind, SamplingParams
from strand.services.async_client import AsyncEngineClient
from strand.services.client import EngineClient, RequestError
from strand.services.launch import Stack

CHAT = {"messages": [{"role": "user", "content": "kalo mi"}]}
ONE_TOKEN = SamplingParams(max_tokens=1, output_kind=RequestOutputKind.FINAL_ONLY)


@pytest.mark.parametrize("prompt", ["kalo mi sona", CHAT, {**CHAT, "add_generation_prompt": False}])
def test_tokenize_says_what_a_request_would_carry(client: EngineClient,
                                                  prompt: str | dict) -> None:
    tokenized = client.tokenize(prompt)
    final = list(client.generate(prompt, ONE_TOKEN))[-1]
    assert tokenized["tokens"] == final.prompt_token_ids
    assert tokenized["count"] == len(final.prompt_token_ids)
    assert tokenized["max_model_len"] == client.get_server_info()["max_model_len"]
    assert tokenized["token_strs"] is None


def test_tokenize_options_and_detokenize_round_trip(client: EngineClient) -> None:
    plain = client.tokenize("kalo mi", add_special_tokens=False, return_token_strs=True)
    with_bos = client.tokenize("kalo mi")["tokens"]
    assert with_bos[1:] == plain["tokens"] and len(with_bos) == plain["count"] + 1
    assert len(plain["token_strs"]) == plain["count"]
    assert client.detokenize(plain["tokens"]) == "kalo mi"
    assert client.detokenize(with_bos).endswith("kalo mi")  # the bos is written out
    assert client.detokenize(with_bos) != "kalo mi"


def test_bad_ids_are_invalid_argument_and_add_nothing(client: EngineClient) -> None:
    vocab = client.get_server_info()["vocab_size"]
    with pytest.raises(RequestError) as err:
        client.detokenize([1, vocab])
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert f"tokens must be in [0, {vocab})" in str(err.value)
    with pytest.raises(RequestError) as err:
        client.tokenize({"prompt_token_ids": [-5]})
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "prompt_token_ids" in str(err.value)
    assert not client.has_unfinished_requests()


def test_the_async_client_tokenizes_too(stack: Stack) -> None:
    async def main() -> str:
        async with AsyncEngineClient(stack.gateway_address, timeout=60) as client:
            tokenized = await client.tokenize("kalo mi", add_special_tokens=False)
            return await client.detokenize(tokenized["tokens"])

    assert asyncio.run(main()) == "kalo mi"
