"""BodyLimit: an HTTP body over the bound is a 413 naming it, declared or chunked, and the app
never sees it; a body within the bound reaches the app whole."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from strand.services.openai.body_limit import BodyLimit

LIMIT = 1000


@pytest.fixture
def seen() -> list[int]:
    return []


@pytest.fixture
def client(seen: list[int]) -> Iterator[TestClient]:
    async def endpoint(request: Request) -> JSONResponse:
        body = await request.body()
        seen.append(len(body))
        return JSONResponse({"bytes": len(body)})

    app = Starlette(routes=[Route("/", endpoint, methods=["POST"])])
    with TestClient(BodyLimit(app, max_bytes=LIMIT)) as c:
        yield c


def test_a_body_within_the_bound_reaches_the_app_whole(client: TestClient,
                                                      seen: list[int]) -> None:
    assert client.post("/", content=b"x" * LIMIT).json() == {"bytes": LIMIT}
    chunks = iter([b"a" * 400, b"b" * 400, b"c" * 200])
    assert client.post("/", content=chunks).json() == {"bytes": LIMIT}
    assert seen == [LIMIT, LIMIT]


def test_a_declared_length_over_the_bound_is_refused_unread(client: TestClient,
                                                           seen: list[int]) -> None:
    resp = client.post("/", content=b"x" * (LIMIT + 1))
    assert resp.status_code == 413
    error = resp.json()["error"]
    assert error["message"] == f"request body must be at most {LIMIT} bytes, got {LIMIT + 1}"
    assert error["code"] == "request_too_large" and seen == []


def test_a_chunked_body_is_refused_once_it_passes_the_bound(client: TestClient,
                                                           seen: list[int]) -> None:
    resp = client.post("/", content=iter([b"a" * 600, b"b" * 600, b"c" * 600]))
    assert resp.status_code == 413
    message = resp.json()["error"]["message"]
    assert message.startswith(f"request body must be at most {LIMIT} bytes, got at least ")
    assert int(message.rsplit(" ", 1)[1]) > LIMIT and seen == []


def test_the_bound_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_body_bytes must be >= 1, got 0"):
        BodyLimit(Starlette(), max_bytes=0)
