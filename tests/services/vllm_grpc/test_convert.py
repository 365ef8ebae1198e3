"""vLLM's request messages to Strand's SamplingParams and prompts, and outputs back, as vLLM's
servicer maps them."""

from __future__ import annotations

import pytest

pytest.importorskip("smg_grpc_proto", reason="smg-grpc-proto (a dependency) is not installed")
from smg_grpc_proto.generated import vllm_engine_pb2 as vpb  # noqa: E402

from strand.engine_core.outputs import CompletionOutput, RequestOutput  # noqa: E402
from strand.engine_core.sampling_params import RequestOutputKind  # noqa: E402
from strand.services._proto.strand.v1 import types_pb2 as pb  # noqa: E402
from strand.services.vllm_grpc.convert import (  # noqa: E402
    FieldError,
    complete_response,
    prompt_from_request,
    refuse_unsupported,
    sampling_params_from_proto,
)
from strand.services.vllm_grpc.kv_events import block_hash, convert_batch  # noqa: E402


def test_unset_fields_take_vllms_defaults() -> None:
    params = sampling_params_from_proto(vpb.SamplingParams(), stream=False)
    assert (params.temperature, params.top_p, params.n, params.repetition_penalty) == \
        (1.0, 1.0, 1, 1.0)
    assert params.max_tokens is None and params.seed is None
    assert params.output_kind == RequestOutputKind.FINAL_ONLY


def test_streaming_asks_for_deltas() -> None:
    params = sampling_params_from_proto(vpb.SamplingParams(), stream=True)
    assert params.output_kind == RequestOutputKind.DELTA


def test_set_fields_reach_sampling_params() -> None:
    params = sampling_params_from_proto(vpb.SamplingParams(
        temperature=0.5, top_k=20, max_tokens=7, stop=["x"], seed=3, logprobs=2,
        logit_bias={5: 1.5}, truncate_prompt_tokens=4), stream=False)
    assert (params.temperature, params.top_k, params.max_tokens, params.stop, params.seed,
            params.logprobs, params.logit_bias, params.truncate_prompt_tokens) == \
        (0.5, 20, 7, ["x"], 3, 2, {5: 1.5}, 4)


def test_constraint_oneof_becomes_structured_outputs() -> None:
    params = sampling_params_from_proto(vpb.SamplingParams(regex="[ab]+"), stream=False)
    assert params.structured_outputs is not None
    assert params.structured_outputs.regex == "[ab]+"
    choice = sampling_params_from_proto(vpb.SamplingParams(
        choice=vpb.ChoiceConstraint(choices=["yes", "no"])), stream=False)
    assert choice.structured_outputs is not None
    assert choice.structured_outputs.choice == ["yes", "no"]


def test_a_refused_value_names_its_field() -> None:
    with pytest.raises(FieldError) as info:
        sampling_params_from_proto(vpb.SamplingParams(min_p=3.0), stream=False)
    assert info.value.field == "sampling_params.min_p"


def test_tokenized_prompt_keeps_ids_and_text() -> None:
    request = vpb.GenerateRequest(tokenized=vpb.TokenizedInput(input_ids=[1, 2],
                                                               original_text="hi"))
    assert prompt_from_request(request) == {"prompt_token_ids": [1, 2], "prompt": "hi"}


def test_no_input_is_refused_by_name() -> None:
    with pytest.raises(FieldError) as info:
        prompt_from_request(vpb.GenerateRequest())
    assert info.value.field == "input"


def test_multimodal_inputs_are_refused_by_name() -> None:
    request = vpb.GenerateRequest(mm_inputs=vpb.MultimodalInputs(mm_hashes=["h"]))
    with pytest.raises(FieldError) as info:
        refuse_unsupported(request)
    assert info.value.field == "mm_inputs"


def _output(stop_reason: int | str | None) -> RequestOutput:
    completion = CompletionOutput(index=1, text="ab", token_ids=[4, 5], finish_reason="stop",
                                  stop_reason=stop_reason)
    return RequestOutput(request_id="r", prompt=None, prompt_token_ids=[1, 2, 3],
                         outputs=[completion], finished=True, num_cached_tokens=2)


@pytest.mark.parametrize(("stop_reason", "field"), [(9, "matched_token_id"),
                                                    ("END", "matched_stop_str"),
                                                    (None, None)])
def test_complete_carries_matched_stop(stop_reason: int | str | None, field: str | None) -> None:
    output = _output(stop_reason)
    done = complete_response(output, output.outputs[0], None).complete
    assert done.WhichOneof("matched_stop") == field
    assert (list(done.output_ids), done.index, done.prompt_tokens, done.cached_tokens) == \
        ([4, 5], 1, 3, 2)


def test_kv_batches_become_int64_hashes_with_token_slices() -> None:
    digest_a, digest_b = bytes(range(32)), bytes(range(1, 33))
    batch = pb.KvEventBatch(events=[
        pb.KvEvent(block_stored=pb.BlockStored(block_hashes=[digest_a, digest_b],
                                               token_ids=[1, 2, 3, 4], block_size=2)),
        pb.KvEvent(block_removed=pb.BlockRemoved(block_hashes=[digest_a])),
        pb.KvEvent(all_blocks_cleared=pb.AllBlocksCleared())])
    out = convert_batch(batch, 5)
    assert out.sequence_number == 5
    stored = out.events[0].stored
    assert [list(b.token_ids) for b in stored.blocks] == [[1, 2], [3, 4]]
    assert [b.block_hash for b in stored.blocks] == [block_hash(digest_a), block_hash(digest_b)]
    assert list(out.events[1].removed.block_hashes) == [block_hash(digest_a)]
    assert out.events[2].HasField("cleared")
