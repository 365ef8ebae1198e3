"""Which stream session added which request, so a session's end (its gateway died or left)
releases the requests it still owned instead of leaving them in the stage forever."""

from __future__ import annotations

import itertools
from collections.abc import Iterable


class SessionOwnership:
    def __init__(self) -> None:
        self._owner: dict[str, int] = {}
        self._ids = itertools.count(1)

    def new_session(self) -> int:
        return next(self._ids)

    def add(self, session: int, request_ids: Iterable[str]) -> None:
        for request_id in request_ids:
            self._owner[request_id] = session

    def discard(self, request_ids: Iterable[str]) -> None:
        for request_id in request_ids:
            self._owner.pop(request_id, None)

    def release(self, session: int) -> list[str]:
        """The ids the session still owns, forgotten here: the caller aborts them."""
        owned = [r for r, s in self._owner.items() if s == session]
        self.discard(owned)
        return owned
