"""MultiConnector: every child is called; loads come from the first child with tokens."""

from __future__ import annotations

import pytest

from strand.engine_core.connector.multi import MultiConnector
from tests.engine_core.connector.conftest import RecordingConnector
from tests.engine_core.core.conftest import make_request


@pytest.mark.parametrize(("answers", "expected"), [
    ((True, True), True),
    ((True, None), True),
    ((None, None), True),
    ((True, False), False),
    ((False, True), False),
])
def test_reset_is_all_not_false_and_calls_every_child(
        answers: tuple[bool | None, ...], expected: bool) -> None:
    children = [RecordingConnector(reset_answer=a) for a in answers]
    assert MultiConnector(children).reset_cache() is expected
    assert [c.calls for c in children] == [[("reset",)], [("reset",)]]


@pytest.mark.parametrize(("answer", "expected"), [(True, True), (None, True), (False, False)])
def test_children_answering_true_none_false_give_true_true_false(
        answer: bool | None, expected: bool) -> None:
    children = [RecordingConnector(reset_answer=True), RecordingConnector(reset_answer=answer),
                RecordingConnector(reset_answer=True)]
    assert MultiConnector(children).reset_cache() is expected
    assert all(c.calls == [("reset",)] for c in children)


def test_tokens_come_from_the_first_child_that_has_any() -> None:
    empty, first, second = (RecordingConnector(matched=0), RecordingConnector(matched=8),
                            RecordingConnector(matched=12))
    multi = MultiConnector([empty, first, second])
    request = make_request("r", 20)
    assert multi.get_num_new_matched_tokens(request, 0) == 8
    # vLLM: every child is asked, the first with a hit serves the load.
    assert [c.calls for c in (empty, first, second)] == [[("match", "r")]] * 3
    assert multi.loader_of("r") == 1
    multi.update_state_after_alloc(request, [1, 2, 3, 4, 5], 0, 8)
    assert empty.calls[-1] == ("alloc", "r", 0)
    assert first.calls[-1] == ("alloc", "r", 8)
    assert second.calls[-1] == ("alloc", "r", 0)


def test_each_child_loads_its_own_metadata() -> None:
    silent, loader = RecordingConnector(matched=0), RecordingConnector(matched=4)
    multi = MultiConnector([silent, loader])
    meta = multi.build_connector_meta()
    assert meta == (None, ("meta", id(loader)))
    multi.start_load_kv(meta, [])
    assert ("load", ("meta", id(loader))) in loader.calls
    assert not any(call[0] == "load" for call in silent.calls)


def test_no_child_metadata_means_no_metadata() -> None:
    multi = MultiConnector([RecordingConnector(), RecordingConnector()])
    assert multi.build_connector_meta() is None


def test_a_finished_request_is_offered_to_every_child() -> None:
    children = [RecordingConnector(), RecordingConnector()]
    MultiConnector(children).request_finished(make_request("r", 8), [4, 7])
    assert [c.calls for c in children] == [[("finished", "r", (4, 7))]] * 2


def test_clear_reaches_every_child_and_sums_what_they_dropped() -> None:
    children = [RecordingConnector(location="cpu"), RecordingConnector(location="disk"),
                RecordingConnector(location="cpu")]
    multi = MultiConnector(children)
    assert multi.clear("cpu") == 6
    assert multi.clear("gpu") is None
    assert all(("clear", "cpu") in c.calls for c in children)


def test_lookup_reports_every_childs_location() -> None:
    multi = MultiConnector([RecordingConnector(matched=8, location="cpu"),
                            RecordingConnector(matched=4, location="disk")])
    assert multi.lookup([b"a", b"b"]) == {"cpu": 2, "disk": 1}
    assert multi.locations == ("cpu", "disk")


def test_a_multi_connector_needs_children() -> None:
    with pytest.raises(ValueError, match="connectors must name at least one"):
        MultiConnector([])
