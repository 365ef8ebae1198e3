"""One step's grammar constraint for the sampler: a packed token bitmask over the constrained
rows of the batch, filled by the rows' matchers in one batched call and applied to the logits
in one kernel call (disallowed tokens -> -inf)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import xgrammar as xg

# One filler for the process: it fills many matchers' rows on its own threads, which the GIL
# would otherwise serialise. Capped: the engine's own OpenMP threads need the cores.
_batch_filler: xg.BatchGrammarMatcher | None = None


def _filler() -> xg.BatchGrammarMatcher:
    global _batch_filler
    if _batch_filler is None:
        _batch_filler = xg.BatchGrammarMatcher(max_threads=max(1, min(4, os.cpu_count() or 1)))
    return _batch_filler


@dataclass(slots=True)
class GrammarMask:
    """Rows of the batch whose next token a grammar constrains."""

    rows: list[int]  # indices into the batch, ascending
    bitmask: torch.Tensor  # [num_reqs, ceil(vocab / 32)] int32 on the host; bit set = allowed


def build_grammar_mask(matchers: list[xg.GrammarMatcher | None],
                       eos_token_ids: list[int | None], vocab_size: int) -> GrammarMask | None:
    """matchers[i]: row i's matcher (None: unconstrained). None when no row is constrained.

    A matcher that already accepted its stop token (a request going on with ignore_eos) has no
    next-token set: its row allows EOS only, so the output stays what the grammar produced."""
    rows = [i for i, m in enumerate(matchers) if m is not None]
    if not rows:
        return None
    bitmask = xg.allocate_token_bitmask(len(matchers), vocab_size)  # all bits set: allowed
    live: list[xg.GrammarMatcher] = []
    live_rows: list[int] = []
    for i in rows:
        matcher = matchers[i]
        assert matcher is not None
        if matcher.is_terminated():
            bitmask[i] = 0
            eos = eos_token_ids[i]
            if eos is not None:
                bitmask[i, eos // 32] = _bit(eos % 32)
        else:
            live.append(matcher)
            live_rows.append(i)
    if live:
        _filler().batch_fill_next_token_bitmask(live, bitmask, live_rows)
    return GrammarMask(rows=rows, bitmask=bitmask)


def apply_grammar_mask(
    logits: torch.Tensor,  # [num_reqs, vocab] float32, edited in place
    mask: GrammarMask,
) -> torch.Tensor:
    bitmask = mask.bitmask.to(logits.device, non_blocking=True)
    xg.apply_token_bitmask_inplace(logits, bitmask, vocab_size=logits.shape[1],
                                   indices=mask.rows)
    return logits


def _bit(position: int) -> int:
    """The int32 value with only bit `position` set (bit 31 is the sign bit)."""
    return (1 << position) - (1 << 32) if position == 31 else 1 << position
