"""NgramProposer: drafts a request's next tokens from its own history (prompt lookup).

The last n tokens (n from prompt_lookup_max down to prompt_lookup_min) are looked up earlier
in the request's tokens; the tokens that followed the first earlier occurrence of the longest
such n-gram are the draft. vLLM's rule, so the same prompts draft the same tokens.

Each request's tokens are mirrored in a numpy array that grows with the request (a few
appends a step), so a lookup is a handful of vectorized compares over the history instead of
a Python loop over it, and no index of n-grams has to be kept per request.
"""

from __future__ import annotations

import numpy as np

from strand.engine_core.speculative_config import SpeculativeConfig


class NgramProposer:
    def __init__(self, config: SpeculativeConfig) -> None:
        self.k = config.num_speculative_tokens
        self.min_n = config.prompt_lookup_min
        self.max_n = config.prompt_lookup_max
        self._tokens: dict[str, np.ndarray] = {}
        self._lengths: dict[str, int] = {}

    def propose(self, req_id: str, token_ids: list[int], max_drafts: int) -> list[int]:
        """Up to min(k, max_drafts) tokens to follow token_ids; [] when nothing matches."""
        k = min(self.k, max_drafts)
        if k <= 0 or len(token_ids) <= self.min_n:
            return []
        tokens = self._mirror(req_id, token_ids)
        start = find_match(tokens, self.min_n, self.max_n)
        if start < 0:
            return []
        return tokens[start:start + k].tolist()

    def drop(self, req_id: str) -> None:
        self._tokens.pop(req_id, None)
        self._lengths.pop(req_id, None)

    def _mirror(self, req_id: str, token_ids: list[int]) -> np.ndarray:
        """token_ids as an int64 array, appending only what is new since the last call."""
        n = len(token_ids)
        buf = self._tokens.get(req_id)
        have = self._lengths.get(req_id, 0)
        if buf is None or have > n:  # new, or its history was cut (never, but be exact)
            buf, have = np.empty(max(2 * n, 64), np.int64), 0
        elif n > len(buf):
            grown = np.empty(2 * n, np.int64)
            grown[:have] = buf[:have]
            buf = grown
        if n > have:
            buf[have:n] = token_ids[have:]
        self._tokens[req_id], self._lengths[req_id] = buf, n
        return buf[:n]


def find_match(tokens: np.ndarray, min_n: int, max_n: int) -> int:
    """Where the draft starts: the position after the first earlier occurrence of the longest
    suffix n-gram, min_n <= n <= max_n; -1 when there is none.

    ends[p] is True while tokens[p - j] == tokens[-1 - j] for every j checked so far, p being
    the last position of a candidate occurrence (p <= len - 2: the suffix itself is not one).
    """
    length = len(tokens)
    best = -1
    ends = tokens[:length - 1] == tokens[length - 1]
    for n in range(1, min(max_n, length - 1) + 1):
        if n > 1:
            # Occurrences ending before n - 1 cannot hold n tokens.
            ends[:n - 1] = False
            ends[n - 1:] &= tokens[:length - n] == tokens[length - n]
        first = int(ends.argmax())
        if not ends[first]:
            break  # no n-gram of this length: no longer one either
        if n >= min_n:
            best = first + 1
    return best
