"""The runner's pooler: which hidden rows a step reads for its requests' embeddings, and the
embedding once a request's last prompt token was computed.

A prompt may take several steps (chunked prefill): MEAN keeps each request's running sum (in
float32) between them, CLS the first position's row. What a preempted request had gathered is
dropped with it; it recomputes its whole prompt (pooling that reads every row takes no
prefix-cache or connector hit, see Request.skips_cached_prefix). A sequence classifier's
pooled row goes through its score layer: the request's output is then the labels' logits.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from strand.engine_core.pooler_config import PoolerConfig


@dataclass(slots=True)
class PoolRows:
    """One step's part: hidden rows to read, and for each request with some, how many (in
    row order) and whether its prompt ends this step."""

    rows: np.ndarray  # [num_rows] int64 indices into the step's tokens
    spans: list[tuple[int, int, bool]]  # (req index, number of rows, prompt done)


class Pooler:
    def __init__(self, config: PoolerConfig, head: nn.Module | None = None) -> None:
        self.config = config
        self.head = head  # a classifier's score layer: hidden -> num_labels
        self._partial: dict[str, torch.Tensor] = {}  # req id -> MEAN's sum, or CLS's row

    def rows(self, query_lens: np.ndarray, computed: np.ndarray, ends: np.ndarray,
             done: np.ndarray) -> PoolRows:
        """done[i]: request i computes its last prompt token this step."""
        kind = self.config.pooling_type
        rows: list[np.ndarray] = []
        spans: list[tuple[int, int, bool]] = []
        for i, (q, c, end, last) in enumerate(zip(query_lens.tolist(), computed.tolist(),
                                                  ends.tolist(), done.tolist(), strict=True)):
            if q == 0:
                continue
            if kind == "MEAN":
                picked = np.arange(end - q, end)
            elif kind == "CLS":
                picked = np.arange(end - q, end - q + 1) if c == 0 else np.empty(0, np.int64)
            else:  # LAST
                picked = np.arange(end - 1, end) if last else np.empty(0, np.int64)
            if len(picked) or last:
                rows.append(picked)
                spans.append((i, len(picked), bool(last)))
        flat = np.concatenate(rows).astype(np.int64) if rows else np.empty(0, np.int64)
        return PoolRows(flat, spans)

    def pool(self, req_ids: list[str], prompt_lens: list[int], part: PoolRows,
             hidden: torch.Tensor) -> dict[str, torch.Tensor]:
        """hidden: [len(part.rows), hidden] at part.rows. The embeddings (float32, on the CPU,
        not normalized), or a classifier's logits, of the requests whose prompt ended this
        step."""
        done: dict[str, torch.Tensor] = {}
        offset = 0
        for i, count, last in part.spans:
            req_id = req_ids[i]
            rows = hidden[offset:offset + count].float()
            offset += count
            if count:
                self._gather(req_id, rows)
            if last:
                gathered = self._partial.pop(req_id)
                if self.config.pooling_type == "MEAN":
                    gathered = gathered / prompt_lens[i]
                if self.head is not None:  # in the model's dtype, as transformers' classifier
                    gathered = self.head(gathered.to(hidden.dtype)[None])[0].float()
                done[req_id] = gathered.cpu()
        return done

    def _gather(self, req_id: str, rows: torch.Tensor) -> None:
        if self.config.pooling_type == "MEAN":
            total = rows.sum(dim=0)
            previous = self._partial.get(req_id)
            self._partial[req_id] = total if previous is None else previous + total
        else:  # CLS: its one row; LAST: the last prompt token's
            self._partial[req_id] = rows[0]

    def forget(self, req_id: str) -> None:
        """A finished or preempted request: what it gathered is no longer needed."""
        self._partial.pop(req_id, None)

