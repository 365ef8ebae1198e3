"""The OpenAI front's output constraints -> StructuredOutputsParams, as vLLM reads them:
vLLM's `structured_outputs` object, its older `guided_json` / `guided_regex` / `guided_choice` /
`guided_grammar` fields, and OpenAI's `response_format` ({"type": "json_object"} or
{"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}})."""

from __future__ import annotations

from typing import Any

from strand.engine_core.structured_output.params import KINDS, StructuredOutputsParams
from strand.services.openai.errors import OpenAIError, bad_request, said_as
from strand.services.openai.protocol import _Sampling

_GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
           "guided_grammar": "grammar"}


def structured_outputs_of(req: _Sampling) -> StructuredOutputsParams | None:
    """None when the request has no constraint; a 400 naming the field when it is malformed."""
    fields: dict[str, Any] = {}
    source = "structured_outputs"
    if req.structured_outputs is not None:
        fields = dict(req.structured_outputs)
    else:
        for name, kind in _GUIDED.items():
            value = getattr(req, name)
            if value is not None:
                fields[kind] = value
                source = name
    if req.response_format is not None:
        had_kind = any(k in KINDS for k in fields)
        _merge_response_format(fields, req.response_format)
        if not had_kind:
            # vLLM merges response_format into structured_outputs (which may carry options
            # such as disable_any_whitespace); the kind is then response_format's.
            source = "response_format"
    if not fields:
        return None
    known = set(StructuredOutputsParams.__dataclass_fields__)
    unknown = sorted(set(fields) - known)
    if unknown:
        raise bad_request(f"structured_outputs has unknown keys {unknown}; allowed: "
                          f"{sorted(known)}", "structured_outputs")
    try:
        return StructuredOutputsParams(**fields)
    except ValueError as exc:
        raise bad_request(str(exc), source) from None


def constraint_source(req: _Sampling) -> str | None:
    """The field the request's constraint came in (what a refusal of it should name)."""
    if req.response_format is not None and req.response_format.get("type") != "text":
        return "response_format" if req.structured_outputs is None else "structured_outputs"
    if req.structured_outputs is not None:
        return "structured_outputs"
    return next((name for name in _GUIDED if getattr(req, name) is not None), None)


def said_of_constraint(error: OpenAIError, source: str | None) -> OpenAIError:
    """The engine's refusal of a spec it could not compile (which it names structured_outputs,
    the field that carried it inside), said of the field the client sent it in."""
    if source in (None, "structured_outputs") or error.param != "structured_outputs":
        return error
    return said_as(error, source)


def _merge_response_format(fields: dict[str, Any], fmt: dict[str, Any]) -> None:
    kind = fmt.get("type")
    if kind == "text":
        return  # OpenAI's default: free text
    if kind == "json_object":
        fields["json_object"] = True
    elif kind == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise bad_request("response_format.json_schema.schema must be a JSON schema object",
                              "response_format")
        fields["json"] = schema
    else:
        raise bad_request("response_format.type must be 'text', 'json_object' or "
                          f"'json_schema', got {kind!r}", "response_format")
