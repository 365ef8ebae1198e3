"""Requests on their way in (tokenized, not yet answered), so that an abort from the gateway
finds them here: a caller that gave up while its request was being tokenized must not have it
run on in the engine until the add's answer has made its way back and an abort has followed."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class Entering:
    aborted: bool = False  # the gateway gave up on it
    engine: str | None = None  # set once the children's add was written to that engine
    child_ids: list[str] = field(default_factory=list)


class EnteringRequests:
    def __init__(self) -> None:
        self._by_id: dict[str, Entering] = {}

    def begin(self, request_id: str) -> Entering:
        entry = Entering()
        self._by_id[request_id] = entry
        return entry

    def end(self, request_id: str, entry: Entering) -> None:
        if self._by_id.get(request_id) is entry:
            del self._by_id[request_id]

    def abort(self, request_ids: list[str]) -> dict[str, list[str]]:
        """Mark them aborted; per engine, the children already sent there (to abort behind
        their add). Ids not on their way in are ignored (their add was answered: the gateway
        aborts those through the detokenizer)."""
        sent: dict[str, list[str]] = {}
        for request_id in request_ids:
            entry = self._by_id.get(request_id)
            if entry is None:
                continue
            entry.aborted = True
            if entry.engine is not None:
                sent.setdefault(entry.engine, []).extend(entry.child_ids)
        return sent
