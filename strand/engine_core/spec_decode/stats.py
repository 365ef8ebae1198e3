"""SpecDecodingStats: how many drafted tokens the target model accepted (vLLM's counters)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class SpecDecodingStats:
    """Counts since start; rates are computed from them."""

    num_drafts: int = 0  # request-steps that carried a draft
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    # [k]: how often the draft token at each position was accepted.
    accepted_per_pos: list[int] = field(default_factory=list)

    def observe(self, num_draft: int, num_accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += num_draft
        self.num_accepted_tokens += num_accepted
        per_pos = self.accepted_per_pos
        if len(per_pos) < num_draft:
            per_pos.extend([0] * (num_draft - len(per_pos)))
        for i in range(num_accepted):
            per_pos[i] += 1

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens a drafted step produced on average: the accepted ones plus the one the
        target always adds (vLLM's "mean acceptance length")."""
        if not self.num_drafts:
            return 0.0
        return 1.0 + self.num_accepted_tokens / self.num_drafts

    def copy(self) -> SpecDecodingStats:
        return SpecDecodingStats(self.num_drafts, self.num_draft_tokens,
                                 self.num_accepted_tokens, list(self.accepted_per_pos))
