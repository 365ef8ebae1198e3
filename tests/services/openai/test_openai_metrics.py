"""The OpenAI front's /metrics counts what it refused itself, before any gateway call: a missing
API key (401) and an oversized body (413), by route, and unknown paths as "other"."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from strand.services.openai.app import FrontConfig, create_app


def _requests(client: TestClient) -> dict[tuple[str, str], float]:
    text = client.get("/metrics").text
    return {(s.labels["route"], s.labels["status"]): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples if s.name == "strand:openai_requests_total"}


def test_refusals_at_the_front_are_counted() -> None:
    # Nothing listens at the gateway address: every request here is answered by the front.
    app = create_app(FrontConfig(gateway="127.0.0.1:9", api_key="k", max_body_bytes=10))
    with TestClient(app) as client:
        assert client.post("/v1/completions", json={"prompt": "x"}).status_code == 401
        keyed = {"Authorization": "Bearer k"}
        assert client.post("/v1/completions", content=b"x" * 11,
                           headers=keyed).status_code == 413
        assert client.get("/whatever").status_code == 404
        counts = _requests(client)
    assert counts[("/v1/completions", "401")] == 1
    assert counts[("/v1/completions", "413")] == 1
    assert counts[("other", "404")] == 1
    assert ("/metrics", "200") not in counts  # a scrape is counted once it has answered
