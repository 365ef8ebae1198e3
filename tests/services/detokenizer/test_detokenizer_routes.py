"""The detokenizer's routes with engine replicas: each request remembers its replica, so a
replica's loss ends only its requests, and a finished or departed request forgets it."""

from __future__ import annotations

from strand.services._proto.strand.v1 import types_pb2 as pb
from strand.services.detokenizer.routes import Routes


def test_requests_are_owned_per_replica_until_they_finish() -> None:
    routes = Routes()
    routes.subscribe("gw-1")
    routes.own("a", "gw-1", "e:1")
    routes.own("b", "gw-1", "e:2")
    assert routes.owned(engine="e:1") == ["a"] and routes.owned(engine="e:2") == ["b"]
    routes.send([pb.RequestOutput(request_id="a", finished=True)])
    assert routes.owned(engine="e:1") == [] and routes.engine_of("a") is None
    assert routes.owned() == ["b"]


def test_a_departed_gateways_requests_keep_their_replica_until_aborted() -> None:
    routes = Routes()
    queue = routes.subscribe("gw-1")
    routes.own("a", "gw-1", "e:1")
    assert routes.unsubscribe("gw-1", queue) == ["a"]
    # The caller aborts it on its replica, which it can still look up; then it is forgotten.
    assert routes.engine_of("a") == "e:1"
    routes.forget(["a"])
    assert routes.engine_of("a") is None and routes.owned() == []
