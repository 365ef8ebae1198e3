"""The OpenAI front's constraint fields -> StructuredOutputsParams, as vLLM reads them."""

from __future__ import annotations

from typing import Any

import pytest

from strand.engine_core.structured_output.params import StructuredOutputsParams
from strand.services.openai.errors import OpenAIError
from strand.services.openai.protocol import CompletionRequest
from strand.services.openai.structured import structured_outputs_of

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}}


def _of(**fields: Any) -> StructuredOutputsParams | None:
    return structured_outputs_of(CompletionRequest(prompt="x", **fields))


def test_no_constraint_is_none() -> None:
    assert _of() is None
    assert _of(response_format={"type": "text"}) is None


@pytest.mark.parametrize("fields,expected", [
    ({"structured_outputs": {"regex": "a+", "disable_any_whitespace": True}},
     StructuredOutputsParams(regex="a+", disable_any_whitespace=True)),
    ({"guided_json": SCHEMA}, StructuredOutputsParams(json=SCHEMA)),
    ({"guided_regex": "[0-9]+"}, StructuredOutputsParams(regex="[0-9]+")),
    ({"guided_choice": ["a", "b"]}, StructuredOutputsParams(choice=["a", "b"])),
    ({"guided_grammar": 'root ::= "x"'}, StructuredOutputsParams(grammar='root ::= "x"')),
    ({"response_format": {"type": "json_object"}}, StructuredOutputsParams(json_object=True)),
    ({"response_format": {"type": "json_schema",
                          "json_schema": {"name": "t", "schema": SCHEMA, "strict": True}}},
     StructuredOutputsParams(json=SCHEMA)),
    ({"response_format": {"type": "json_object"},
      "structured_outputs": {"disable_any_whitespace": True}},
     StructuredOutputsParams(json_object=True, disable_any_whitespace=True)),
])
def test_each_spelling_maps_to_its_kind(fields: dict[str, Any],
                                        expected: StructuredOutputsParams) -> None:
    assert _of(**fields) == expected


@pytest.mark.parametrize("fields,param,match", [
    ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice", "exactly one"),
    ({"guided_regex": "a", "response_format": {"type": "json_object"}}, "guided_regex",
     "exactly one"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "t"}}},
     "response_format", "schema must be a JSON schema object"),
    ({"response_format": {"type": "yaml"}}, "response_format", "must be 'text'"),
    ({"structured_outputs": {"choice": ["a"]}, "response_format": {"type": "json_object"}},
     "structured_outputs", "exactly one"),
    ({"structured_outputs": {"regexp": "a"}}, "structured_outputs", "unknown keys"),
    ({"guided_choice": []}, "guided_choice", "non-empty list"),
])
def test_malformed_constraints_are_400_naming_the_field(fields: dict[str, Any], param: str,
                                                        match: str) -> None:
    with pytest.raises(OpenAIError, match=match) as info:
        _of(**fields)
    assert info.value.status == 400 and info.value.param == param


def test_a_sleeping_engine_is_a_503() -> None:
    import grpc

    from strand.services.openai.errors import from_exception

    class Refused(grpc.RpcError):
        def code(self) -> grpc.StatusCode:
            return grpc.StatusCode.FAILED_PRECONDITION

        def details(self) -> str:
            return "the engine is sleeping: call wake_up() before add_request"

    error = from_exception(Refused())
    assert error.status == 503 and "sleeping" in error.message
