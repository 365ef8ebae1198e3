"""Traces a person can look at: the stack exports to Arize Phoenix (a real OTLP backend, run from
its own venv: scripts/phoenix_setup.sh), the test finds each request's trace by its id through
Phoenix's REST API, and headless Chromium renders Phoenix's trace page.

Skipped, saying why, where .venv-phoenix (or PHOENIX_BIN) is absent; the page test also where
Debian's `chromium` is absent. STRAND_UPDATE_DOCS_IMAGES=1 also writes the screenshot to
docs/images/trace_dashboard.png (off by default: a test run must not rewrite tracked files).
"""

from __future__ import annotations

import os
import shutil
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from strand.engine_core.outputs import RequestOutput
from strand.engine_core.sampling_params import SamplingParams
from strand.services.client import EngineClient
from strand.services.launch import REPO_ROOT
from tests.e2e.conftest import start_stack
from tests.e2e.phoenix import PhoenixServer, chromium, chromium_bin, phoenix_bin

# Phoenix files spans under the resource attribute openinference.project.name ("default" without).
PROJECT = "strand-e2e"
DOCS_IMAGE = REPO_ROOT / "docs" / "images" / "trace_dashboard.png"
WINDOW = (1600, 1000)
STAGE_SPANS = {"strand.v1.Tokenizer/Process", "strand.v1.Engine/add",
               "strand.v1.Detokenizer/add"}


@dataclass(frozen=True, slots=True)
class Traced:
    """A request's trace: its id comes from the test's own root span, not from Phoenix."""
    trace_id: str
    root_span_id: str
    request_id: str
    num_prompt_tokens: int
    num_completion_tokens: int


@dataclass(frozen=True, slots=True)
class Sent:
    phoenix: PhoenixServer
    completed: Traced
    aborted: Traced


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PhoenixServer]:
    executable = phoenix_bin()
    if executable is None:
        pytest.skip("Arize Phoenix is not installed: run scripts/phoenix_setup.sh "
                    "(or set PHOENIX_BIN to a `phoenix` command)")
    server = PhoenixServer(executable, tmp_path_factory.mktemp("phoenix")).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def sent(phoenix: PhoenixServer, tiny_model_dir: Path,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sent]:
    """A manual-mode stack exporting to Phoenix, one request that completes and one aborted
    after its first step, each under a root span of this process (so the test knows each
    trace id before asking Phoenix)."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("OTEL_RESOURCE_ATTRIBUTES", f"openinference.project.name={PROJECT}")
        # Phoenix starts meanwhile (its start-up is the slower one).
        stack = start_stack(tiny_model_dir, tmp_path_factory.mktemp("dashboard-logs"),
                            otlp=phoenix.otlp_endpoint)
    provider = TracerProvider(resource=Resource.create({
        "service.name": "strand-e2e-client", "openinference.project.name": PROJECT}))
    provider.add_span_processor(SimpleSpanProcessor(
        OTLPSpanExporter(endpoint=phoenix.otlp_endpoint, insecure=True)))
    tracer = provider.get_tracer("tests.e2e.test_trace_dashboard")
    try:
        with stack, EngineClient(stack.gateway_address, timeout=60) as client:
            phoenix.wait_ready()
            with tracer.start_as_current_span("client: generate") as root:
                final = list(client.generate(
                    "show me in phoenix", SamplingParams(temperature=0.0, max_tokens=4),
                    request_id="dash-complete"))[-1]
                completed = _traced(root, "dash-complete", len(final.prompt_token_ids or []),
                                    len(final.outputs[0].token_ids))
            with tracer.start_as_current_span("client: add, step, abort") as root:
                prompt_ids = [1, 30, 31, 32, 33, 34]
                client.add_request("dash-abort", {"prompt_token_ids": prompt_ids},
                                   SamplingParams(temperature=0.0, max_tokens=64))
                first = [o for o in client.step()
                         if isinstance(o, RequestOutput) and o.request_id == "dash-abort"]
                client.abort_request("dash-abort")
                aborted = _traced(root, "dash-abort", len(prompt_ids),
                                  sum(len(o.outputs[0].token_ids) for o in first))
            assert client.get_num_unfinished_requests() == 0
    finally:
        provider.shutdown()  # SimpleSpanProcessor: the root spans are exported already
    yield Sent(phoenix, completed, aborted)


def _traced(root: Any, request_id: str, num_prompt: int, num_completion: int) -> Traced:
    context = root.get_span_context()
    return Traced(f"{context.trace_id:032x}", f"{context.span_id:016x}", request_id,
                  num_prompt, num_completion)


def _llm_request(sent: Sent, traced: Traced, extra: set[str]) -> dict[str, Any]:
    spans = sent.phoenix.wait_for_spans(PROJECT, traced.trace_id,
                                        {"llm_request", *STAGE_SPANS, *extra})
    assert {s["context"]["trace_id"] for s in spans} == {traced.trace_id}
    (span,) = [s for s in spans if s["name"] == "llm_request"]
    # The whole ring hangs under the request's span, under the test's own root.
    by_id = {s["context"]["span_id"]: s for s in spans}
    assert {s["name"] for s in spans if s["parent_id"] == span["context"]["span_id"]} >= \
        STAGE_SPANS
    assert by_id[span["parent_id"]]["parent_id"] == traced.root_span_id
    return span


def test_completed_request_is_found_in_phoenix_by_its_trace_id(sent: Sent) -> None:
    traced = sent.completed
    span = _llm_request(sent, traced, {"client: generate", "strand.v1.Inference/Generate"})
    attrs = span["attributes"]
    assert attrs["gen_ai.request.id"] == traced.request_id
    assert attrs["gen_ai.request.max_tokens"] == 4
    assert attrs["gen_ai.usage.prompt_tokens"] == traced.num_prompt_tokens > 0
    assert attrs["gen_ai.usage.completion_tokens"] == traced.num_completion_tokens == 4
    assert attrs["gen_ai.response.finish_reasons"] == ["length"]
    # The current GenAI conventions beside the older names above.
    assert attrs["gen_ai.operation.name"] == "text_completion"
    assert attrs["gen_ai.provider.name"] == "strand"
    assert attrs["gen_ai.usage.input_tokens"] == traced.num_prompt_tokens
    assert attrs["gen_ai.usage.output_tokens"] == 4
    assert span["status_code"] != "ERROR"
    # The other way in (docs/tracing.md): from the request id to its span and trace.
    (found,) = sent.phoenix.spans(PROJECT, name="llm_request",
                                  attribute=f"gen_ai.request.id:{traced.request_id}")
    assert found["context"] == span["context"]


def test_aborted_request_span_says_abort_with_the_tokens_it_had(sent: Sent) -> None:
    traced = sent.aborted
    span = _llm_request(sent, traced, {"client: add, step, abort",
                                       "strand.v1.Inference/AddRequest",
                                       "strand.v1.Inference/Abort"})
    attrs = span["attributes"]
    assert attrs["gen_ai.request.id"] == traced.request_id
    assert attrs["gen_ai.response.finish_reasons"] == ["abort"]
    assert attrs["gen_ai.usage.prompt_tokens"] == traced.num_prompt_tokens
    assert attrs["gen_ai.usage.completion_tokens"] == traced.num_completion_tokens == 1


def test_phoenix_trace_page_shows_the_request(sent: Sent, tmp_path: Path) -> None:
    if chromium_bin() is None:
        pytest.skip("headless Chromium is not installed (Debian: apt-get install chromium)")
    traced = sent.completed
    span = _llm_request(sent, traced, {"strand.v1.Inference/Generate"})
    # Phoenix's span link opens the trace with this span selected (its attributes showing).
    url = f"{sent.phoenix.url}/redirects/spans/{span['context']['span_id']}"
    shot = tmp_path / "trace_dashboard.png"
    # One page load for both: the DOM says what the page shows, the PNG is what a person sees.
    dom = chromium(url, "--dump-dom", f"--screenshot={shot}", window=WINDOW).decode(
        errors="replace").replace("<wbr>", "")  # Phoenix breaks long keys with <wbr>
    for text in (traced.trace_id, "llm_request", "strand.v1.Tokenizer/Process",
                 "gen_ai.usage.completion_tokens", traced.request_id):
        assert text in dom, f"the rendered trace page lacks {text!r}"
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", data[16:24]) == WINDOW  # IHDR: width, height
    # A blank page of this size compresses to a few KB; the rendered trace to ~100 KB.
    assert len(data) > 40_000, f"screenshot of {len(data)} bytes: an empty page?"
    if os.environ.get("STRAND_UPDATE_DOCS_IMAGES") == "1":
        DOCS_IMAGE.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, DOCS_IMAGE)
