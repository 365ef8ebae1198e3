"""vLLM's gRPC messages (vllm.grpc.engine, from smg-grpc-proto) to Strand's dataclasses and back,
as vLLM's own servicer maps them: proto3 zeros mean "unset" where vLLM's do (top_p, n,
repetition_penalty), `optional` fields are read only when present."""

from __future__ import annotations

from typing import Any

from smg_grpc_proto.generated import vllm_engine_pb2 as vpb

from strand.engine_core.outputs import CompletionOutput, Logprob, RequestOutput
from strand.engine_core.sampling_params import RequestOutputKind, SamplingParams
from strand.engine_core.structured_output.params import StructuredOutputsParams


class FieldError(ValueError):
    """A request field Strand refuses: answered INVALID_ARGUMENT with the field's name."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def prompt_from_request(request: vpb.GenerateRequest) -> dict[str, Any] | str:
    """The request's prompt: token ids as they come (smg tokenizes), or text."""
    kind = request.WhichOneof("input")
    if kind == "tokenized":
        ids = list(request.tokenized.input_ids)
        if not ids:
            raise FieldError("tokenized.input_ids", "must not be empty")
        prompt: dict[str, Any] = {"prompt_token_ids": ids}
        if request.tokenized.original_text:
            prompt["prompt"] = request.tokenized.original_text
        return prompt
    if kind == "text":
        if not request.text:
            raise FieldError("text", "must not be empty")
        return request.text
    raise FieldError("input", "set one of tokenized or text")


def refuse_unsupported(request: vpb.GenerateRequest) -> None:
    """Multimodal inputs, media references and KV-transfer params: not served here, refused by
    name rather than ignored."""
    if request.HasField("mm_inputs") or len(request.extra_mm_inputs):
        raise FieldError("mm_inputs", "multimodal inputs are not supported by Strand")
    if request.HasField("media_refs"):
        raise FieldError("media_refs", "media references are not supported by Strand")
    if request.HasField("kv_transfer_params") or request.HasField("kv_transfer_params_json"):
        raise FieldError("kv_transfer_params", "PD disaggregation is not supported by Strand")
    if request.HasField("data_parallel_rank") and request.data_parallel_rank != 0:
        raise FieldError("data_parallel_rank", "Strand's gateway routes among its replicas "
                         "itself; only 0 (or unset) is accepted")


def sampling_params_from_proto(params: vpb.SamplingParams, stream: bool) -> SamplingParams:
    """vLLM's servicer's mapping; a value SamplingParams refuses is a FieldError naming
    sampling_params.<field>."""
    try:
        return SamplingParams(
            temperature=params.temperature if params.HasField("temperature") else 1.0,
            top_p=params.top_p if params.top_p != 0.0 else 1.0,
            top_k=params.top_k,
            min_p=params.min_p,
            frequency_penalty=params.frequency_penalty,
            presence_penalty=params.presence_penalty,
            repetition_penalty=params.repetition_penalty or 1.0,
            max_tokens=params.max_tokens if params.HasField("max_tokens") else None,
            min_tokens=params.min_tokens,
            stop=list(params.stop),
            stop_token_ids=list(params.stop_token_ids),
            skip_special_tokens=params.skip_special_tokens,
            spaces_between_special_tokens=params.spaces_between_special_tokens,
            ignore_eos=params.ignore_eos,
            n=params.n or 1,
            logprobs=params.logprobs if params.HasField("logprobs") else None,
            prompt_logprobs=(params.prompt_logprobs if params.HasField("prompt_logprobs")
                             else None),
            seed=params.seed if params.HasField("seed") else None,
            include_stop_str_in_output=params.include_stop_str_in_output,
            logit_bias={int(k): float(v) for k, v in params.logit_bias.items()} or None,
            truncate_prompt_tokens=(params.truncate_prompt_tokens
                                    if params.HasField("truncate_prompt_tokens") else None),
            structured_outputs=_constraint(params),
            output_kind=RequestOutputKind.DELTA if stream else RequestOutputKind.FINAL_ONLY,
        )
    except FieldError:
        raise
    except (ValueError, TypeError) as exc:
        message = str(exc)
        raise FieldError(f"sampling_params.{message.split(' ', 1)[0]}", message) from exc


def _constraint(params: vpb.SamplingParams) -> StructuredOutputsParams | None:
    kind = params.WhichOneof("constraint")
    if kind is None:
        return None
    try:
        if kind == "json_schema":
            return StructuredOutputsParams(json=params.json_schema)
        if kind == "regex":
            return StructuredOutputsParams(regex=params.regex)
        if kind == "grammar":
            return StructuredOutputsParams(grammar=params.grammar)
        if kind == "json_object":
            return StructuredOutputsParams(json_object=params.json_object) \
                if params.json_object else None
        if kind == "choice":
            return StructuredOutputsParams(choice=list(params.choice.choices))
    except ValueError as exc:
        raise FieldError(f"sampling_params.{kind}", str(exc)) from exc
    raise FieldError(f"sampling_params.{kind}", "not supported by Strand")


# -- outputs ------------------------------------------------------------------------------------


def chunk_response(output: RequestOutput, completion: CompletionOutput, num_logprobs: int | None,
                   first: bool) -> vpb.GenerateResponse:
    """One streamed delta of one choice (prompt logprobs with its first chunk only)."""
    chunk = vpb.GenerateStreamChunk(
        token_ids=completion.token_ids, prompt_tokens=len(output.prompt_token_ids),
        completion_tokens=len(completion.token_ids), cached_tokens=output.num_cached_tokens,
        index=completion.index)
    _fill_logprobs(chunk, output, completion, num_logprobs, first)
    return vpb.GenerateResponse(chunk=chunk)


def complete_response(output: RequestOutput, completion: CompletionOutput,
                      num_logprobs: int | None) -> vpb.GenerateResponse:
    """A choice's end. Streamed, its token ids and counts are the last delta's (smg adds up the
    chunks); not streamed, everything."""
    done = vpb.GenerateComplete(
        output_ids=completion.token_ids, finish_reason=completion.finish_reason or "stop",
        prompt_tokens=len(output.prompt_token_ids),
        completion_tokens=len(completion.token_ids),
        cached_tokens=output.num_cached_tokens, index=completion.index)
    if isinstance(completion.stop_reason, int):
        done.matched_token_id = completion.stop_reason
    elif isinstance(completion.stop_reason, str):
        done.matched_stop_str = completion.stop_reason
    _fill_logprobs(done, output, completion, num_logprobs, True)
    return vpb.GenerateResponse(complete=done)


def _fill_logprobs(msg: vpb.GenerateStreamChunk | vpb.GenerateComplete, output: RequestOutput,
                   completion: CompletionOutput, num_logprobs: int | None, first: bool) -> None:
    if completion.logprobs:
        out = msg.output_logprobs
        for token_id, entry in zip(completion.token_ids, completion.logprobs, strict=False):
            chosen = entry.get(token_id)
            if chosen is None:
                continue
            out.token_ids.append(token_id)
            out.token_logprobs.append(chosen.logprob)
            if num_logprobs:
                out.top_logprobs.append(_top(entry, num_logprobs))
    if first and output.prompt_logprobs:
        inp = msg.input_logprobs
        for token_id, maybe in zip(output.prompt_token_ids, output.prompt_logprobs,
                                   strict=False):
            value = vpb.InputTokenLogProb()
            if maybe is not None and token_id in maybe:
                value.value = maybe[token_id].logprob
            inp.token_logprobs.append(value)
            inp.token_ids.append(token_id)
            inp.top_logprobs.append(_top(maybe or {}, len(maybe or {})))


def _top(entry: dict[int, Logprob], num: int) -> vpb.TopLogProbs:
    """The `num` most likely of one position, most likely first."""
    ranked = sorted(entry.items(), key=lambda kv: -kv[1].logprob)[:max(num, 0)]
    return vpb.TopLogProbs(token_ids=[t for t, _ in ranked], values=[lp.logprob for _, lp in ranked])
